"""site.yml on the freshly booted guest, before anything was deployed (converge.yml's first play on the guest):
a dry run (--check --diff) and a run the preflight refuses; the guest's state is the same after each, and the dry
run passes end to end, saying under their real paths what it would write and what it would start."""

import json
import os

import pytest

from conftest import PROJECT

REPORT = os.path.join(PROJECT, "build", "reports", "fresh-guest.json")


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


def test_the_dry_run_changed_nothing(fresh):
    assert fresh["after_dry_run"] == fresh["before"]


def test_the_dry_run_passes_without_a_warning(fresh):
    run = fresh["dry_run"]
    assert int(run["rc"]) == 0, run["output"][-3000:]
    assert "[WARNING]" not in run["output"] and "...ignoring" not in run["output"], run["output"][-3000:]


@pytest.mark.parametrize("shown", [
    "+++ after: /etc/sysctl.d/60-inferops-numa.conf",
    "+++ after: /usr/local/lib/inferops-numa/",  # the helper version's launcher; /usr/local/bin/numa-pin links to it
    "+++ after: /etc/systemd/system/inferops-numa-metrics.timer",
    "+++ after: /etc/systemd/system/llama@.service",
    '"path": "/etc/inferops-numa"',
    "would start llama@0.service",
    "would start llama@1.service",
])
def test_the_dry_run_shows_what_it_would_write_and_start(fresh, shown):
    assert shown in fresh["dry_run"]["output"]


def test_every_diff_is_headed_by_the_path_it_would_write(fresh):
    headers = [line for line in fresh["dry_run"]["output"].splitlines()
               if line.startswith(("--- before:", "+++ after:"))]
    assert headers, "no diff header at all"
    # Files by their real path (never a temporary .j2), the rollout's starts by its header, which names no file.
    named = [line.split(": ", 1)[1] for line in headers]
    elsewhere = [name for name in named if name != "systemd units, started or restarted"
                 and not name.startswith(("/etc/", "/usr/", "/proc/"))]
    assert not elsewhere, elsewhere
    assert "systemd units, started or restarted" in named


def test_the_refused_run_names_the_problem_and_changed_nothing(fresh):
    run = fresh["refused_run"]
    assert int(run["rc"]) != 0
    assert ("preflight: numa-lab: numa_host_metrics_period_seconds: 5 is out of range; give a value from 10 to "
            "86400") in run["output"], run["output"][-3000:]
    assert "PLAY [Prepare each NUMA host" not in run["output"], run["output"][-3000:]
    assert fresh["after_refused_run"] == fresh["before"]
