"""site.yml on the freshly booted guest, before anything was deployed (converge.yml's first play on the guest):
a dry run (--check --diff) that fails nothing, warns of nothing, shows what it would write under the real paths and
what it would start, and a run the preflight refuses; the guest's state is the same after each."""

import json
import os
import re

import pytest

from conftest import PROJECT

REPORT = os.path.join(PROJECT, "build", "reports", "fresh-guest.json")
RECAP = re.compile(r"^numa-lab\s+:\s+ok=\d+\s+changed=\d+\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)


@pytest.fixture(scope="module")
def fresh(host):
    """What converge.yml recorded on this guest (its machine-id first), when the guest was fresh."""
    assert os.path.isfile(REPORT), "%s missing: converge.yml writes it on a fresh guest (molecule test)" % REPORT
    with open(REPORT) as handle:
        report = json.load(handle)
    machine_id = host.file("/etc/machine-id").content_string.strip()
    assert report["before"].splitlines()[0] == machine_id, "the report is of another guest: run molecule test"
    return report


def test_the_guest_was_fresh(fresh):
    assert "exists" not in fresh["before"] and "no user llama" in fresh["before"], fresh["before"]


def test_the_dry_run_fails_nothing_and_warns_of_nothing(fresh):
    run = fresh["dry_run"]
    assert int(run["rc"]) == 0, run["output"][-3000:]
    assert RECAP.findall(run["output"]) == [("0", "0")], run["output"][-3000:]
    assert "[WARNING]" not in run["output"] and "...ignoring" not in run["output"], run["output"]


def test_the_dry_run_shows_the_files_under_their_real_paths_and_what_it_would_start(fresh):
    output = fresh["dry_run"]["output"]
    # The files are shown in diffs headed by their own paths (the plan directory a dry run does not make is
    # shown being made; what would go into it cannot be compared).
    for path in ("+++ after: /etc/systemd/system/llama@.service", "+++ after: /usr/local/bin/numa-pin",
                 "/etc/sysctl.d/60-inferops-numa.conf", '"path": "/etc/inferops-numa"'):
        assert path in output, path
    temporary = [line for line in output.splitlines() if line.startswith("+++ after: ") and "tmp" in line]
    assert temporary == [], "diffs headed by a temporary file: %s" % temporary
    assert "would start llama@0.service" in output and "would start llama@1.service" in output, output[-3000:]


def test_the_dry_run_changed_nothing(fresh):
    assert fresh["after_dry_run"] == fresh["before"]


def test_the_refused_run_names_the_problem_and_changed_nothing(fresh):
    run = fresh["refused_run"]
    assert int(run["rc"]) != 0
    assert ("preflight: numa-lab: numa_host_metrics_period_seconds: 5 is out of range; give a value from 10 to "
            "86400") in run["output"], run["output"][-3000:]
    assert "PLAY [Prepare NUMA hosts]" not in run["output"], run["output"][-3000:]
    assert fresh["after_refused_run"] == fresh["before"]
