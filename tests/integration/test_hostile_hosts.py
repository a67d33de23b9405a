"""A fleet with hostile hosts through playbooks/fleet_report.yml and cost_report.yml, for real.

Each fake host's "Python" prints a result chosen here instead of running the module (a rogue root on
that host could), and one real host reads a captured machine whose sysfs names and values carry
Jinja, HTML, Markdown and control characters. The reports must evaluate nothing (a Jinja lookup would
create a marker file on the controller), let no host text open markup in either page, list the hosts
whose results do not fit with the reason, and still report every other host. tests/matrix.py runs
this on the oldest and the newest ansible-core too: the oldest templates strings again where 2.19
and later do not.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.fixtures import sysfs
from tests.tools import ansible_command

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def lookups(marker):
    """Host text that, once evaluated by Ansible's templar, would touch ``marker`` on the controller."""
    return "{{ lookup('pipe', 'touch %s') }}" % marker


MARKUP = ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "[click](javascript:alert(1))",
          "https://evil.example/x", "a | forged | cell", "line\n## Forged heading", "`code` ``fence", "\x1b[31mred",
          "bidi \u202e txt", "{{7*7}}", "cut {{ 7*", "{% if %}"]


def metrics_result(marker, text):
    """A numa_metrics result of the right shape whose every free-text field is ``text`` (plus a lookup)."""
    evil = "%s %s" % (text, lookups(marker))
    return {"changed": False,
            "host": {"numa_balancing": 0, "node_count": 1, "cpu_count": 2, "gpu_count": 1,
                     "nodes": [{"id": 0, "memory_free_bytes": 1 << 30}]},
            "topology": {"nodes": [{"id": 0, "cpus": 2, "cpulist": evil, "memory_total_bytes": 2 << 30,
                                    "gpus": [evil]}]},
            "instances": [{"unit": evil, "policy": evil, "nodes": evil, "cpulist": evil, "up": False, "state": evil,
                           "local_ratio": {"anon": None, "file": None, "judged": None}, "min_local_percent": 99,
                           "drift": False, "affinity_match": None, "message": evil}],
            "planned": [{"unit": evil, "service": evil, "policy": None, "nodes": "", "cpulist": "", "threads": 0,
                         "gpus": [], "port": None, "error": evil}],
            "read_warnings": [evil]}


def cost_result(marker, text):
    evil = "%s %s" % (text, lookups(marker))
    return {"changed": False, "nodes": [0, 1], "topology_signature": evil,
            "latency_ratio": [[1.0, 1.5], [1.5, 1.0]], "bandwidth_ratio": [[1.0, 0.7], [0.7, 1.0]],
            "distance": [[10, 21], [21, 10]], "distance_ratio": [[1.0, 2.1], [2.1, 1.0]],
            "latency_ns": [[90.0, 135.0], [135.0, 90.0]], "bandwidth_gbps": [[10.0, 7.0], [7.0, 10.0]],
            "unmeasured": {evil: evil}, "notes": [evil],
            "method": {"measured": evil, "latency": evil, "spread": [[1.0, 1.0], [1.0, 1.0]], "notes": [evil]},
            "remote_ratio": {"available": False, "reason": evil}, "elapsed_seconds": 1.0}


def fake_interpreter(directory, name, printed):
    """An "interpreter" that ignores the module it is given and prints ``printed``."""
    payload = os.path.join(directory, name + ".out")
    with open(payload, "w", encoding="utf-8") as handle:
        handle.write(printed)
    script = os.path.join(directory, name + "-python")
    with open(script, "w") as handle:
        handle.write("#!%s\nimport sys\nsys.stdout.write(open(%r, encoding='utf-8').read())\n" % (sys.executable,
                                                                                                 payload))
    os.chmod(script, 0o755)
    return script


def fake_hosts(directory, printed):
    """Inventory entries of hosts on the local connection, each printing its ``printed[name]`` as its result."""
    return {name: {"ansible_connection": "local", "ansible_python_interpreter": fake_interpreter(directory, name, text)}
            for name, text in printed.items()}


def hostile_machine(root, marker):
    """A captured dual-socket GPU machine whose sysfs carries markup and Jinja in names and values."""
    machine = sysfs.dual_socket_gpus()
    machine.add_pci("0000:c3:00.0{{7*7}}<img src=x onerror=alert(1)>[x](javascript:1)", 0x030200, 0x10de, 0x2330, 1,
                    list(range(40, 80)))
    machine.put("sys/bus/pci/devices/0000:c1:00.0/numa_node",
                "%s\n## <script>alert(1)</script>\x1b[31m | x |" % lookups(marker))
    return machine.write(root)


def run_playbook(tmp_path, playbook, hosts, extra):
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"all": {"hosts": hosts}}))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run([ansible_command("ansible-playbook"), "-i", str(inventory),
                           os.path.join(REPO, "playbooks", playbook)] + extra,
                          cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-4000:]
    return done.stdout


def outside_code_spans(markdown):
    """The Markdown text with every code span taken out (an independent reading of CommonMark's rule:
    a run of N backticks opens a span that the next run of exactly N backticks closes)."""
    pieces, position = [], 0
    for match in re.finditer(r"`+", markdown):
        if match.start() < position:
            continue
        closing = re.search(r"(?<!`)%s(?!`)" % match.group(0), markdown[match.end():])
        if closing is None:
            continue
        pieces.append(markdown[position:match.start()])
        position = match.end() + closing.end()
    pieces.append(markdown[position:])
    return "".join(pieces)


def assert_markdown_is_inert(markdown, headings):
    plain = outside_code_spans(markdown)
    for opener in ("<", "](", "https://", "{{", "\x1b", "\u202e"):
        assert opener not in plain.replace("CPU \\ memory", ""), opener
    assert sorted(line for line in markdown.splitlines() if line.startswith("#")) == sorted(headings)
    table = []
    for line in markdown.splitlines() + [""]:
        if line.startswith("|"):
            table.append(len(re.findall(r"(?<!\\)\|", outside_code_spans(line.replace("\\|", "")))))
        elif table:
            assert len(set(table)) == 1, table  # no host value added a cell to its row
            table = []


def assert_html_is_inert(html):
    for opener in ("<script", "<img", "\x1b", "\u202e"):
        assert opener not in html, opener
    assert "&lt;script&gt;" in html


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "EVALUATED-ON-THE-CONTROLLER"
    yield str(path)
    assert not path.exists(), "host text was evaluated as a template on the controller"


def test_the_fleet_report_treats_every_byte_a_host_returns_as_data(tmp_path, marker):
    printed = {"evil-%02d" % index: json.dumps(metrics_result(marker, text)) for index, text in enumerate(MARKUP)}
    wrong_type = metrics_result(marker, "x")
    wrong_type["instances"][0]["min_local_percent"] = "99"
    printed.update({"wrong-type": json.dumps(wrong_type), "not-an-object": "[1, 2, 3]",
                    "not-json": "<html>{{ 7*7 }}", "huge": json.dumps(metrics_result(marker, "x" * 200000)),
                    "cut": '{"host": {"nodes": "{{'})
    hosts = fake_hosts(str(tmp_path), printed)
    hosts["captured"] = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                         "numa_root": hostile_machine(str(tmp_path / "machine"), marker),
                         "inference_service_list": [{"name": "llama", "command": ["/usr/bin/llama-server"], "layout": "per_gpu",
                                                     "model_size": "1G"}]}
    output = run_playbook(tmp_path, "fleet_report.yml", hosts, ["-e", "fleet_report_dir=report"])
    assert "EVALUATED" not in output.replace(marker, "")
    markdown = (tmp_path / "report" / "fleet_report.md").read_text()
    html = (tmp_path / "report" / "fleet_report.html").read_text()

    answered = ["evil-%02d" % index for index in range(len(MARKUP))] + ["captured"]
    assert "%d host(s): %d answered, 5 without a result;" % (len(hosts), len(answered)) in markdown
    assert_markdown_is_inert(markdown, ["# NUMA fleet report", "## Hosts", "## Hosts without a result"]
                             + ["## %s" % name for name in sorted(answered)])
    assert_html_is_inert(html)
    assert "{{7*7}}" in markdown and "{{7*7}}" in html and "49" not in outside_code_spans(markdown)
    assert "- **wrong-type**: `rejected: its result does not match what numa_metrics returns (instances[0]." \
           "min_local_percent: text '99' where a number was expected)" in markdown
    assert re.search(r"^- \*\*huge\*\*: `rejected: .* [0-9]+ characters, more than 4096\)", markdown, re.MULTILINE)
    for name in ("not-an-object", "not-json", "cut"):
        assert re.search(r"^- \*\*%s\*\*: `failed: " % name, markdown, re.MULTILINE), name
    # The captured machine is reported whole: its three GPUs (one with a hostile PCI name) and planned instances.
    assert "| captured | 2 | 160 | 3 | `ON (NUMA hinting faults migrate pages)` | 0 | 0 |" in markdown
    assert "`llama@2.service`" in markdown and "`0000:c3:00.0{{7*7}}<img src=x onerror=alert(1)>[x](javascript:1)`" \
        in markdown
    assert "0000:c3:00.0{{7*7}}&lt;img src=x onerror=alert(1)&gt;[x](javascript:1)" in html


def test_the_cost_report_treats_every_byte_a_host_returns_as_data(tmp_path, marker):
    printed = {"evil-%02d" % index: json.dumps(cost_result(marker, text)) for index, text in enumerate(MARKUP)}
    wrong_type = cost_result(marker, "x")
    wrong_type["latency_ns"][0][1] = "135"
    printed["wrong-type"] = json.dumps(wrong_type)
    hosts = fake_hosts(str(tmp_path), printed)
    hosts["down"] = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1,
                     "ansible_ssh_common_args": "-o ConnectTimeout=5"}
    output = run_playbook(tmp_path, "cost_report.yml", hosts, ["-e", "cost_report_dir=report"])
    assert "EVALUATED" not in output.replace(marker, "")
    markdown = (tmp_path / "report" / "cost_report.md").read_text()
    html = (tmp_path / "report" / "cost_report.html").read_text()
    assert "%d host(s), %d host type(s), 2 without a result." % (len(hosts), len(MARKUP)) in markdown
    headings = [line for line in markdown.splitlines() if line.startswith("#")]
    assert_markdown_is_inert(markdown, headings)
    assert len([line for line in headings if line.startswith("### ")]) == len(MARKUP)
    assert all(line.startswith(("# NUMA", "## Host type", "### evil-", "## Hosts without")) for line in headings)
    assert_html_is_inert(html)
    assert "- **wrong-type**: `rejected: its result does not match what numa_cost returns (latency_ns[0][1]: text " \
           "'135' where a number was expected)" in markdown
    assert re.search(r"^- \*\*down\*\*: `unreachable: ", markdown, re.MULTILINE)


def test_a_cost_report_without_any_answering_host_says_why(tmp_path):
    down = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1,
            "ansible_ssh_common_args": "-o ConnectTimeout=5"}
    run_playbook(tmp_path, "cost_report.yml", {"down-1": down, "down-2": dict(down)},
                 ["-e", "cost_report_dir=report"])
    markdown = (tmp_path / "report" / "cost_report.md").read_text()
    assert "2 host(s), 0 host type(s), 2 without a result." in markdown
    assert re.search(r"^- \*\*down-1\*\*: `unreachable: ", markdown, re.MULTILINE)
    assert re.search(r"^- \*\*down-2\*\*: `unreachable: ", markdown, re.MULTILINE)
