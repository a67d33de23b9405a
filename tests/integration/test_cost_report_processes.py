"""The cost report playbook, run by ansible-playbook on this host."""

import os
import re
import subprocess
import sys

from tests.tools import ansible_command
from tests.unit.test_cost_report import PLAYBOOK, REPO


def test_playbook_measures_this_host_and_writes_both_reports_where_it_runs(tmp_path):
    """Into the directory ansible-playbook runs in, never the collection's (an installed one may be read-only)."""
    playbook_command = ansible_command("ansible-playbook")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    here:\n      ansible_connection: local\n"
                         "      ansible_python_interpreter: %s\n" % sys.executable)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
    in_collection = set(os.listdir(os.path.dirname(PLAYBOOK)))
    done = subprocess.run([playbook_command, "-i", str(inventory), PLAYBOOK, "-e", "numa_cost_buffer_mb=64",
                           "-e", "numa_cost_chase_steps=100000", "-e", "numa_cost_rounds=1",
                           "-e", "numa_cost_window_seconds=0.2"],
                          cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "NUMA cost report of 1 host(s) (0 without a result): %s/cost_report.md and " % os.path.abspath(str(tmp_path)) \
        in done.stdout
    assert set(os.listdir(os.path.dirname(PLAYBOOK))) == in_collection
    markdown = (tmp_path / "cost_report.md").read_text()
    assert "1 host(s), 1 host type(s)." in markdown
    assert "### here" in markdown and "**Latency, ns (measured)**" in markdown
    latency = re.search(r"\*\*Latency, ns \(measured\)\*\*\n\n.*\n.*\n\| \*\*node \d+\*\* \| ([\d.]+) \|", markdown)
    assert latency and float(latency.group(1)) > 0
    assert (tmp_path / "cost_report.html").read_text().count("<h2>Host type ") == 1
