"""The metrics text checked by promtool, and numa-pin metrics run as a process."""

import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.watch import exposition, metrics

from tests.fixtures import sysfs
from tests.tools import missing
from tests.unit.test_audit import PAGE
from tests.unit.test_metrics import (NAMES, PACKAGE_PARENT, Systemd, host, machine_root,  # noqa: F401 (fixtures)
                                     samples, snapshot_of, value)


def promtool():
    found = shutil.which("promtool")
    if found is None:
        missing("promtool is not installed (Debian: apt-get install prometheus; make apt installs it)")
    return found


def promtool_check(text):
    """promtool check metrics: the text parses, and follows the naming and HELP conventions (its lint)."""
    done = subprocess.run([promtool(), "check", "metrics"], input=text, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=60, check=False)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout
    return done


def test_the_text_passes_promtool_and_says_what_was_measured(host):
    text = exposition.render(snapshot_of(host), {"llama@1.service": {"last_seconds": 1, "counts": {"restart": 2}}})
    promtool_check(text)
    trapped = {"unit": "llama@1.service", "policy": "bind", "nodes": "1", "service": "llama"}
    assert value(text, "inferops_numa_instance_local_ratio", memory="file", **trapped) == 0.0
    assert value(text, "inferops_numa_instance_local_ratio", memory="anon", **trapped) == 1.0
    assert value(text, "inferops_numa_instance_judged_local_ratio", pages="all", **trapped) < 0.99
    assert value(text, "inferops_numa_instance_min_local_ratio", **trapped) == 0.99
    assert value(text, "inferops_numa_instance_drift", **trapped) == 1
    assert value(text, "inferops_numa_instance_affinity_match", **trapped) == 0
    assert value(text, "inferops_numa_instance_remote_bytes", memory="file", **trapped) == 8455 * PAGE
    assert value(text, "inferops_numa_instance_drift_actions_total", action="restart", **trapped) == 2
    assert value(text, "inferops_numa_instance_drift", unit="llama@0.service") == 0
    assert value(text, "inferops_numa_instance_up", unit="down@0.service") == 0
    assert ("inferops_numa_instance_drift", frozenset({("unit", "down@0.service"), ("service", "down"),
                                                       ("policy", "interleave"), ("nodes", "0-1")})) \
        not in samples(text)  # a stopped instance has no locality to show
    assert value(text, "inferops_numa_kernel_numa_balancing") == 1
    assert value(text, "inferops_numa_node_numa_hit_total", node=1) == 1001
    assert value(text, "inferops_numa_node_other_node_total", node=0) == 5
    assert value(text, "inferops_numa_node_gpus", node=1) == 2
    assert value(text, "inferops_numa_node_memory_free_bytes", node=0) == 200 * 1024 ** 3


@settings(max_examples=20, deadline=None)
@given(units=st.lists(NAMES, min_size=1, max_size=4, unique=True), policy=NAMES)
def test_any_label_text_is_escaped_so_promtool_reads_it(units, policy):
    instances = []
    for unit in units:
        instances.append({"unit": unit, "service": unit + '"\\\n', "policy": policy, "nodes": "0", "up": True,
                          "plan_age_seconds": 1.5, "min_local_percent": 99, "pages": "all", "drift": False,
                          "affinity_match": True, "local_ratio": {"anon": 1.0, "file": None, "judged": 1.0},
                          "resident_bytes": {"anon": 4096, "file": 0}, "remote_bytes": {"anon": 0, "file": 0}})
    snap = {"host": {"numa_balancing": None, "node_count": 0, "nodes": []}, "instances": instances,
            "warnings": [], "timestamp_seconds": 1.0, "duration_seconds": 0.01}
    text = exposition.render(snap)
    promtool_check(text)
    assert text.count("inferops_numa_instance_up{") == len(units)


def test_no_plan_directory_means_no_instances(tmp_path):
    root = sysfs.amd_nps4().write(str(tmp_path / "root"))
    snap = metrics.collect(root, str(tmp_path / "missing"), Systemd({}), page_size=PAGE)
    assert snap["instances"] == [] and snap["host"]["node_count"] == 8
    promtool_check(exposition.render(snap))


def numa_pin(*args):
    launcher = "import sys; sys.path.insert(0, %r); from numa.cli.numa_pin import run; run()" % PACKAGE_PARENT
    return subprocess.run([sys.executable, "-I", "-S", "-c", launcher, "metrics"] + list(args),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120,
                          check=False)


def test_numa_pin_metrics_on_this_host_passes_promtool(tmp_path):
    done = numa_pin("--stdout", "--plan-dir", str(tmp_path / "none"))
    assert done.returncode == 0, done.stderr
    promtool_check(done.stdout)
    assert "inferops_numa_node_numa_hit_total{node=" in done.stdout


def test_numa_pin_metrics_writes_the_textfile(tmp_path):
    os.chmod(str(tmp_path), 0o755)
    done = numa_pin("--textfile-dir", str(tmp_path / "out"), "--plan-dir", str(tmp_path / "none"),
                    "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 0 and done.stdout == "", done.stderr
    promtool_check((tmp_path / "out" / exposition.TEXTFILE_NAME).read_text())


def test_numa_pin_metrics_refuses_a_writable_directory_in_one_line(tmp_path):
    os.chmod(str(tmp_path), 0o777)
    done = numa_pin("--textfile-dir", str(tmp_path), "--plan-dir", str(tmp_path / "none"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "refusing the textfile directory" in done.stderr
