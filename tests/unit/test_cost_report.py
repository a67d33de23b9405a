"""The fleet report: the filter's model and both templates on fake results, then the playbook for real."""

import os
import re


from ansible_collections.inferops.numa.plugins.plugin_utils import cost_report as report_filter
from ansible_collections.inferops.numa.plugins.plugin_utils import report_pages

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATES = os.path.join(REPO, "playbooks", "templates")
PLAYBOOK = os.path.join(REPO, "playbooks", "cost_report.yml")

SIGNATURE = "node0:2cpu node1:2cpu slit=10,21/21,10"


def emulated_guest(latency_remote=101.0, bandwidth_remote=39.0):
    """A numa_cost result as the QEMU lab guest gives it: flat measurement, SLIT 21."""
    return {
        "nodes": [0, 1],
        "latency_ns": [[100.0, latency_remote], [latency_remote, 100.0]],
        "bandwidth_gbps": [[40.0, bandwidth_remote], [bandwidth_remote, 40.0]],
        "latency_ratio": [[1.0, latency_remote / 100.0], [latency_remote / 100.0, 1.0]],
        "bandwidth_ratio": [[1.0, bandwidth_remote / 40.0], [bandwidth_remote / 40.0, 1.0]],
        "distance": [[10, 21], [21, 10]], "distance_ratio": [[1.0, 2.1], [2.1, 1.0]],
        "local_reference": [0, 1], "unmeasured": {}, "placement": {}, "notes": [],
        "method": {"measured": "latency_ns ... measured; distance ... SLIT", "latency": "chase", "noise": "load 0.1",
                   "notes": [], "spread": [[1.05, 1.3], [1.1, 1.0]]},
        "remote_ratio": {"window_seconds": 1.0, "nodes": [{"node": 0, "allocations": 200, "remote_share": 0.25},
                                                          {"node": 1, "allocations": 0, "remote_share": None}],
                         "perf": {"available": False, "reason": "perf reports <not supported>"}},
        "topology_signature": SIGNATURE, "elapsed_seconds": 6.5,
    }


def real_two_socket():
    result = emulated_guest(latency_remote=150.0, bandwidth_remote=20.0)
    result["latency_ns"][1] = [None, 90.0]
    result["latency_ratio"][1] = [None, 1.0]
    result["bandwidth_gbps"][1] = [None, 40.0]
    result["bandwidth_ratio"][1] = [None, 1.0]
    result["unmeasured"] = {"1->0": "killed: it did not finish in the 9.0 s of the max_seconds=20 budget that were left"}
    return result


def fleet():
    return {"guest-a": {"numa_cost_result": emulated_guest()},
            "guest-b": {"numa_cost_result": emulated_guest(latency_remote=103.0)},
            "box": {"numa_cost_result": dict(real_two_socket(), topology_signature="node0:8cpu node1:8cpu slit=10,32/32,10")},
            "broken": {"numa_cost_result": {"failed": True, "msg": "set_mempolicy(bind, nodes 1) failed with EPERM"}},
            "down": {}}


HOSTS = ["guest-a", "guest-b", "box", "broken", "down"]


def render(name, model):
    """A page as the numa_report action renders it: report_pages' own escaping environments."""
    kind, fmt = name[:-len(".j2")].rsplit(".", 1)
    return report_pages.render(kind, model)[fmt]


def test_hosts_are_grouped_by_identical_shape_largest_group_first():
    model = report_filter.numa_cost_report(fleet(), HOSTS)
    assert [(g["index"], g["hosts"], g["signature"]) for g in model["groups"]] == [
        (1, ["guest-a", "guest-b"], SIGNATURE), (2, ["box"], "node0:8cpu node1:8cpu slit=10,32/32,10")]
    assert model["host_count"] == 5
    assert [(h["name"], h["error"]) for h in model["failed"]] == [
        ("broken", "failed: set_mempolicy(bind, nodes 1) failed with EPERM"),
        ("down", "no result: the host was not reached or was skipped")]


def test_group_heatmap_is_the_cellwise_median_and_ignores_unmeasured_cells():
    assert report_filter.median_matrix([[[1.0, 1.01]], [[1.0, 1.03]], [[None, 1.02]]]) == [[1.0, 1.02]]
    assert report_filter.median_matrix([[[1.0, None]], [[1.0, None]]]) == [[1.0, None]]
    group = report_filter.numa_cost_report(fleet(), HOSTS)["groups"][0]
    assert [cell["text"] for cell in group["latency_ratio"]["rows"][0]["cells"]] == ["1.00", "1.02"]
    assert [cell["text"] for cell in group["distance_ratio"]["rows"][0]["cells"]] == ["1.00", "2.10"]


def test_heat_runs_green_to_red_on_both_sides_of_one():
    assert report_filter.heat(1.0, 2.5) == "#e8f5e9"
    assert report_filter.heat(2.5, 2.5) == report_filter.heat(9.0, 2.5) == "#e57373"
    assert report_filter.heat(0.3, 0.3) == "#e57373" and report_filter.heat(1.2, 0.3) == "#e8f5e9"
    assert report_filter.heat(None, 2.5) == "#eeeeee"
    middle = report_filter.heat(1.75, 2.5)
    assert middle not in ("#e8f5e9", "#e57373")


def test_verdict_says_emulated_when_measurement_is_flat_but_slit_is_not():
    flat = report_filter.verdict([[1.0, 1.02], [1.01, 1.0]], [[1.0, 2.1], [2.1, 1.0]])
    assert flat[0] == "measured remote/local latency up to 1.02x; SLIT claims up to 2.10x"
    assert "emulated NUMA" in flat[1] and "trust the measured ratios" in flat[1]
    real = report_filter.verdict([[1.0, 1.5], [None, 1.0]], [[1.0, 3.2], [3.2, 1.0]])
    assert real == ["measured remote/local latency up to 1.50x; SLIT claims up to 3.20x"]
    assert report_filter.verdict([[1.0]], [[1.0]]) == ["one NUMA node: no memory is remote"]
    assert "only the firmware's SLIT" in report_filter.verdict([[1.0, None], [None, 1.0]], [[1.0, 2.1], [2.1, 1.0]])[0]


def test_markdown_report_shows_measured_and_slit_side_by_side_and_labels_them():
    text = render("cost_report.md.j2", report_filter.numa_cost_report(fleet(), HOSTS))
    assert "5 host(s), 2 host type(s), 2 without a result." in text
    assert "| 1 | guest-a, guest-b | `%s` |" % SIGNATURE in text
    guest = text[text.index("### guest-a"):text.index("### guest-b")]
    assert "**Latency ratio (measured)**\n\n| CPU \\ memory | node 0 | node 1 |\n|---|---:|---:|\n" \
           "| **node 0** | 1.00 | 1.01 |\n| **node 1** | 1.01 | 1.00 |\n" in guest
    assert "**SLIT distance ratio (not measured)**" in guest and "| **node 0** | 1.00 | 2.10 |" in guest
    assert "| **node 0** | 10 | 21 |" in guest
    assert "emulated NUMA" in guest
    assert "**Noise: median / fastest chase stretch (1.00 = quiet host)**" in guest
    assert "| **node 0** | 1.05 | 1.30 |" in guest
    assert "- `node 0: 25.0% of 200 pages allocated in 1.0s were for tasks on other nodes`" in guest
    assert "- `perf node-loads: unavailable (perf reports <not supported>)`" in guest
    box = text[text.index("### box"):]
    assert "| **node 1** | `-` | 1.00 |" in box
    assert "- `1->0: killed: it did not finish in the 9.0 s of the max_seconds=20 budget that were left`" in box
    assert "- **broken**: `failed: set_mempolicy(bind, nodes 1) failed with EPERM`" in text
    assert "\n\n\n\n" not in text


def test_html_report_is_self_contained_with_a_heatmap_per_host_type():
    page = render("cost_report.html.j2", report_filter.numa_cost_report(fleet(), HOSTS))
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"https?://|<script|<link|<img|@import|url\(", page)
    assert page.count("<h2>Host type ") == 2
    # The red end for the real box's remote latency ratio 1.50 lies between the ends; SLIT 2.10 is coloured too.
    assert 'style="background:%s">1.50<' % report_filter.heat(1.5, report_filter.LATENCY_WORST) in page
    assert 'style="background:%s">2.10<' % report_filter.heat(2.1, report_filter.LATENCY_WORST) in page
    assert page.count("firmware SLIT, not measured") >= 4
    assert "set_mempolicy(bind, nodes 1) failed with EPERM" in page


def test_html_escapes_host_supplied_text():
    hosts = {"x": {"numa_cost_result": dict(emulated_guest(), unmeasured={"0->1": "<b>bad</b> & worse"})}}
    page = render("cost_report.html.j2", report_filter.numa_cost_report(hosts, ["x"]))
    assert "&lt;b&gt;bad&lt;/b&gt; &amp; worse" in page and "<b>bad</b>" not in page
