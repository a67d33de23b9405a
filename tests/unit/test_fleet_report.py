"""The fleet report: services planned as the role plans them, the filter's model and both templates on fake
results, where the report may go, and how host text is made one line (playbooks/fleet_report.yml for real:
tests/integration/test_fleet_report_processes.py)."""

import os

import importlib

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.watch import fleet
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.placement import Request, plan
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.topology import read
from ansible_collections.inferops.numa.plugins.plugin_utils import fleet_report, report_pages

from tests.fixtures import sysfs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATES = os.path.join(REPO, "playbooks", "templates")


def report_filter():
    """The filter plugin, imported when a test runs: it imports ansible.errors, and with that imported at
    collection time test_balancing_module's in-process module runs no longer return their warnings."""
    return importlib.import_module("ansible_collections.inferops.numa.plugins.filter.numa_fleet_report")


def report_model(hostvars, hosts):
    """The model as the numa_report action builds it (the filter returns the same, marked unsafe)."""
    return fleet_report.numa_fleet_report(hostvars, hosts)


@pytest.fixture(scope="module")
def gpu_host(tmp_path_factory):
    return read(sysfs.dual_socket_gpus().write(str(tmp_path_factory.mktemp("gpus"))))


def test_per_node_plans_one_instance_per_node_with_cpus_as_the_role_does(gpu_host):
    rows = fleet.plan_service(gpu_host, {"name": "llama", "layout": "per_node", "model_size": "14G",
                                         "port_base": 8080})
    assert [(row["unit"], row["nodes"], row["port"]) for row in rows] == [
        ("llama@0.service", "0", 8080), ("llama@1.service", "1", 8081)]
    direct = plan(gpu_host, Request(instances=2, instance=1, gpus="none", model_size="14G", port_base=8080,
                                    anchors=[0, 1])).to_dict()
    assert (rows[1]["cpulist"], rows[1]["policy"], rows[1]["gpus"]) == (direct["cpulist"], direct["policy"], [])


def snc2_with_a_misleading_slit():
    """Two sockets of two sub-NUMA nodes (SNC2): nodes 0-1 on package 0, 2-3 on package 1, 8 CPUs and 60 GiB
    free each; the SLIT claims node 2 of the other socket nearer to node 0 than node 0's own sibling node 1."""
    machine = sysfs.Machine()
    for node in range(4):
        machine.add_cpus(list(range(node * 8, node * 8 + 8)), package=node // 2, core_base=node * 8)
    slit = {(0, 1): 31, (0, 2): 21, (0, 3): 31, (1, 2): 31, (1, 3): 31, (2, 3): 12}
    for node in range(4):
        distances = [10 if other == node else slit[tuple(sorted((node, other)))] for other in range(4)]
        machine.add_node(node, list(range(node * 8, node * 8 + 8)), 64 * sysfs.GIB_KB, 60 * sysfs.GIB_KB,
                         distances=distances)
    return machine.finish(online=range(32), nodes=range(4), has_cpu=range(4), has_memory=range(4),
                          total_kb=256 * sysfs.GIB_KB, free_kb=240 * sysfs.GIB_KB)


def test_per_socket_runs_one_instance_per_package_over_all_its_nodes_interleaved(tmp_path):
    host = read(sysfs.amd_nps4().write(str(tmp_path)))
    rows = fleet.plan_service(host, {"name": "llama", "layout": "per_socket", "model_size": "100G"})
    assert [(row["unit"], row["policy"], row["nodes"], row["cpulist"]) for row in rows] == [
        ("llama@0.service", "interleave", "0-3", "0-63"), ("llama@1.service", "interleave", "4-7", "64-127")]


def test_an_oversized_instance_spills_within_its_socket_before_the_nearest_other_node(tmp_path):
    host = read(snc2_with_a_misleading_slit().write(str(tmp_path)))
    # 70 GiB + 10 % + 1 GiB does not fit node 0's 60 GiB: its own socket's node 1 comes before node 2,
    # which the SLIT ranks nearer.
    (row,) = fleet.plan_service(host, {"name": "big", "model_size": "70G", "node": 0})
    assert (row["policy"], row["nodes"]) == ("interleave", "0-1")
    # Bigger than the socket (two nodes, 120 GiB): the other socket's nearest node by SLIT next.
    (row,) = fleet.plan_service(host, {"name": "bigger", "model_size": "140G", "node": 0})
    assert (row["policy"], row["nodes"]) == ("interleave", "0-2")
    rows = fleet.plan_service(host, {"name": "llama", "layout": "per_socket", "model_size": "70G"})
    assert [(row["nodes"], row["cpulist"]) for row in rows] == [("0-1", "0-15"), ("2-3", "16-31")]


def test_per_gpu_gives_each_instance_its_gpu(gpu_host):
    rows = fleet.plan_service(gpu_host, {"name": "vllm", "layout": "per_gpu", "model_size": "30G"})
    assert [row["gpus"] for row in rows] == [["0000:81:00.0"], ["0000:c1:00.0"]]
    assert all(row["nodes"] == "1" and row["error"] is None for row in rows)


def test_a_service_that_cannot_be_placed_is_a_row_saying_why(gpu_host, tmp_path):
    too_big = fleet.plan_service(gpu_host, {"name": "huge", "model_size": "4T", "on_unfit": "fail"})
    assert len(too_big) == 1 and too_big[0]["policy"] is None and "GiB" in too_big[0]["error"]
    no_gpu = read(sysfs.amd_nps4().write(str(tmp_path)))
    assert "layout per_gpu gives no instance here (0 GPUs" in fleet.plan_service(
        no_gpu, {"name": "v", "layout": "per_gpu"})[0]["error"]
    assert "layout 'sideways' is none of" in fleet.plan_service(no_gpu, {"name": "v", "layout": "sideways"})[0]["error"]


def result(balancing=0, drift=False, gate=None):
    instance = {"unit": "llama@1.service", "policy": "bind", "nodes": "1", "cpulist": "2-3", "up": True,
                "local_ratio": {"anon": 1.0, "file": 0.5 if drift else 1.0, "judged": 0.9 if drift else 1.0},
                "min_local_percent": 99.0, "drift": drift, "affinity_match": not drift, "message": "ok",
                "ab_gate": gate, "off_plan_thread_ratio": 0.25 if drift else 0.0}
    return {"host": {"numa_balancing": balancing, "node_count": 2, "cpu_count": 4, "gpu_count": 1,
                     "nodes": [{"id": 0, "memory_free_bytes": 2 << 30}, {"id": 1, "memory_free_bytes": 1 << 30}]},
            "topology": {"nodes": [{"id": 0, "cpus": 2, "cpulist": "0-1", "memory_total_bytes": 4 << 30, "gpus": []},
                                   {"id": 1, "cpus": 2, "cpulist": "2-3", "memory_total_bytes": 4 << 30,
                                    "gpus": ["0000:81:00.0"]}]},
            "instances": [instance], "read_warnings": ["node 3 has no\nmeminfo"],
            "planned": [{"unit": "llama@0.service", "policy": "bind", "nodes": "0", "cpulist": "0-1", "threads": 2,
                         "gpus": [], "port": 8080, "error": None}]}


HOSTVARS = {"good": {"fleet_report_result": result(gate={"kept": True, "gain_percent": 65.06})},
            "drifting": {"fleet_report_result": result(balancing=1, drift=True)},
            "gone": {"fleet_report_result": {"unreachable": True, "msg": "Failed to connect\nto the host"}},
            "broken": {"fleet_report_result": {"failed": True, "msg": "topology root '/x' is not a directory"}},
            "skipped": {"fleet_report_result": {"skipped": True, "skip_reason": "Conditional result was False"}},
            "<script>": {}}
HOSTS = ["good", "drifting", "gone", "broken", "skipped", "<script>"]


def test_the_model_lists_every_host_and_why_some_have_no_result():
    model = report_model(HOSTVARS, HOSTS)
    assert [host["name"] for host in model["answered"]] == ["good", "drifting"]
    assert model["missing"] == [
        {"name": "gone", "error": "unreachable: Failed to connect to the host"},
        {"name": "broken", "error": "failed: topology root '/x' is not a directory"},
        {"name": "skipped", "error": "skipped: Conditional result was False"},
        {"name": "<script>", "error": "no result: the host was not reached or was skipped"}]
    assert (model["host_count"], model["instance_count"], model["drifted"], model["balancing_on"]) == (6, 2, 1, 1)
    drifting = model["answered"][1]
    assert drifting["balancing"].startswith("ON") and drifting["nodes"][1]["gpus"] == "0000:81:00.0"
    assert drifting["instances"][0]["judged"] == "90.00 %" and drifting["instances"][0]["affinity"] == "NO"
    assert drifting["warnings"][:3] == [
        "automatic NUMA balancing is on: the kernel moves pinned services' pages (numa_host turns it off)",
        "llama@1.service drifted: 90.00 % of its pages on node(s) 1, below 99 %",
        "llama@1.service: a thread may run outside the plan's CPUs 2-3"]
    assert drifting["warnings"][3] == "node 3 has no meminfo"


def test_no_host_at_all_is_a_report_too():
    model = report_model({}, [])
    assert model["host_count"] == 0 and render("fleet_report.md.j2", model).startswith("# NUMA fleet report")


def render(name, model):
    """A page as the numa_report action renders it: report_pages' own escaping environments."""
    kind, fmt = name[:-len(".j2")].rsplit(".", 1)
    return report_pages.render(kind, model)[fmt]


def test_both_pages_show_the_hosts_their_nodes_services_and_warnings():
    model = report_model(HOSTVARS, HOSTS)
    markdown = render("fleet_report.md.j2", model)
    html = render("fleet_report.html.j2", model)
    assert "| drifting | 2 | 4 | 1 | `ON (NUMA hinting faults migrate pages)` | 1 | 1 | 4 |" in markdown
    assert "| `llama@1.service` | up | bind | 1 | 2-3 | 100.00 % | 50.00 % | 90.00 % | 99 % | DRIFT | NO |" in markdown
    assert "| `llama@0.service` | bind | 0 | 0-1 | 2 | `-` | 8080 |" in markdown
    # The measured gain column: the A/B gate's verdict where one measured, "-" elsewhere.
    assert "| 100.00 % | 100.00 % | 100.00 % | 99 % | no | yes | 0.00 % | `-` | `+65.1 %, kept` |" in markdown
    # The threads off plan column: one straggler of four shows though every thread may run only on the plan's CPUs.
    assert "| DRIFT | NO | 25.00 % | `-` | `-` |" in markdown and "+65.1 %, kept</td>" in html
    assert '<td class="n">25.00 %</td>' in html
    assert "| 1 | 2 | 2-3 | 4.0 | 1.0 | `0000:81:00.0` |" in markdown
    assert "- **gone**: `unreachable: Failed to connect to the host`" in markdown
    assert "<script>" not in html and "&lt;script&gt;" in html and 'class="bad">DRIFT' in html


def test_the_report_goes_to_the_current_or_given_directory_never_into_an_installed_collection(tmp_path, monkeypatch):
    monkeypatch.chdir(str(tmp_path))
    assert report_filter().numa_fleet_report_dir(None) == str(tmp_path)
    assert report_filter().numa_fleet_report_dir("out") == str(tmp_path / "out")
    installed = tmp_path / "ansible_collections" / "inferops" / "numa"
    (installed / "plugins").mkdir(parents=True)
    (installed / "MANIFEST.json").write_text("{}")
    with pytest.raises(report_filter().AnsibleFilterError, match="inside the installed collection"):
        report_filter().numa_fleet_report_dir(str(installed / "playbooks"))
    monkeypatch.chdir(str(installed))
    with pytest.raises(report_filter().AnsibleFilterError, match="write the report elsewhere"):
        report_filter().numa_fleet_report_dir("")


# --- the report's text checks -------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(), max_size=40) | st.text("ab \t\n\x1b\u202e\u200b\xa0é", max_size=40),
       st.integers(min_value=0, max_value=50))
def test_one_line_takes_printable_text_as_it_is_and_escapes_the_rest_character_by_character(text, limit):
    from ansible_collections.inferops.numa.plugins.plugin_utils import host_results

    every_character = " ".join(host_results.escaped(text[:limit]).split()) + ("..." if len(text) > limit else "")
    assert host_results.one_line(text, limit) == every_character
    assert host_results.escaped("a\tb\x1b\u202e") == "a b\\x1b\\u202e"


# --- each escaping rule, value by value (tests/mutants.py) -------------------------------------------------------

@pytest.mark.parametrize("value, shown", [
    ("llama 7B, 99 %", "llama 7B, 99 %"),                 # letters, digits, spaces and ", % -": as it is
    ("99.50 %", "99.50 %"),                               # a dot between digits
    ("www.example.org", "`www.example.org`"),             # a dot elsewhere would be a link
    ("node 0.", "`node 0.`"),
    ("a|b", "`a\\|b`"),                                   # no pipe opens a table cell, in a span or not
    ("x`y", "``x`y``"),                                   # the fence is longer than any backtick run inside
    ("a``b`", "``` a``b` ```"),                           # a backtick at an edge is kept off the fence by a space
    ("`tick", "`` `tick ``"),
    ("# title\nnext | row", "`# title next \\| row`"),    # one line: no new heading or row
    ("two\nlines", "two lines"),
    ("<b>bold</b>", "`<b>bold</b>`"),
    ("[x](http://e.org)", "`[x](http://e.org)`"),
    ("bidi\u202eend", "`bidi\\u202eend`"),
    (42, "42"),
    ("", ""),
])
def test_a_markdown_value_is_plain_text_or_a_code_span_on_one_line(value, shown):
    assert report_pages.markdown_value(value) == shown


def test_markdown_the_templates_made_and_markup_are_printed_as_they_are():
    table = report_pages.MarkdownText("| a |\n| - |")
    assert report_pages.markdown_value(table) is table
    markup = report_pages.Markup("<td>1</td>")
    assert report_pages.html_value(markup) is markup
    assert report_pages.html_value("a\n<b>\tb\x1b") == "a <b> b\\x1b"  # one line; autoescape does the rest
    assert report_pages.html_value(7) == 7


def test_a_hosts_text_cannot_open_markup_or_a_new_line_in_either_page():
    hostile = "<img src=x onerror=alert(1)>\n# owned | `x`"
    result = dict(HOSTVARS["drifting"]["fleet_report_result"])
    result["read_warnings"] = [hostile]
    pages = report_pages.render("fleet_report", report_model({"h": {"fleet_report_result": result}}, ["h"]))
    assert "<img" not in pages["html"] and "&lt;img src=x onerror=alert(1)&gt; # owned | `x`" in pages["html"]
    assert "- `` <img src=x onerror=alert(1)> # owned \\| `x` ``" in pages["md"]  # ends with a backtick: padded
    assert "\n# owned" not in pages["md"]


@pytest.mark.parametrize("balancing, words, on", [
    (0, "off", False), (1, "ON (NUMA hinting faults migrate pages)", True), (2, "memory tiering", False),
    (3, "ON + memory tiering", True), (None, "unknown (not readable)", False)])
def test_balancing_is_on_for_the_kernels_values_1_and_3_only(balancing, words, on):
    entry = fleet_report.host_entry("h", {"host": {"numa_balancing": balancing}})
    assert (entry["balancing"], entry["balancing_on"]) == (words, on)
    assert (fleet_report._warnings(balancing, [], [], {}) != []) is on


def test_the_topology_summary_counts_bytes_and_lists_the_gpus_without_a_node():
    topology = {"nodes": [{"id": 0, "cpulist": "0-1", "cpus": [0, 1], "memory_total_kb": 3, "gpus": ["0000:01:00.0"]}],
                "gpus": [{"address": "0000:01:00.0", "numa_node": 0}, {"address": "0000:02:00.0", "numa_node": None}],
                "cpus": {"online": "0-1"}}
    assert fleet.summary(topology) == {
        "nodes": [{"id": 0, "cpulist": "0-1", "cpus": 2, "memory_total_bytes": 3072, "gpus": ["0000:01:00.0"]}],
        "gpus_without_node": ["0000:02:00.0"], "cpus_online": "0-1"}
