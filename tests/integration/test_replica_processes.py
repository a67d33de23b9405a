"""The replica copy for real: fincore witnesses what it caches, and a copy in a process of its own is stopped and
killed."""

import json
import os
import signal
import subprocess
import sys

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import pagecache, replica

from tests.integration.test_pagecache_processes import fincore_pages
from tests.integration.test_cli_processes import PACKAGE_PARENT, numa_pin
from tests.unit.test_pagecache import disk_dir  # noqa: F401  (a fixture)
from tests.unit.test_replica import (SIZE, SLOW_COPY, model, partial_copies,  # noqa: F401 (model: a fixture)
                                     tmpfile_supported)


def test_the_copy_is_cached_on_the_plan_node_and_the_source_pages_are_dropped(model, disk_dir):  # noqa: F811
    copy, _ = replica.ensure_replica(model, os.path.join(disk_dir, "replicas"), [0])
    assert fincore_pages(model) == 0
    assert pagecache.file_residency(copy)["nodes"] == {"0": SIZE // pagecache.PAGE}


def start_slow_copy(model, root, naming):
    child = subprocess.Popen([sys.executable, "-c", SLOW_COPY, model, root, naming], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=PACKAGE_PARENT))
    assert child.stdout.readline() == "copying\n", child.communicate(timeout=30)[1]
    return child


@pytest.mark.parametrize("signum, naming", [(signal.SIGTERM, "unnamed"), (signal.SIGTERM, "named"),
                                            (signal.SIGINT, "named")])
def test_a_stop_signal_during_the_copy_removes_the_partial_copy_then_takes_effect(model, disk_dir,  # noqa: F811
                                                                                 signum, naming):
    root = os.path.join(disk_dir, "replicas")
    child = start_slow_copy(model, root, naming)
    node = os.path.join(root, "node0")
    assert len(partial_copies(child.pid, node)) == 1
    child.send_signal(signum)
    child.communicate(timeout=30)
    assert child.returncode == -signum
    assert os.listdir(node) == [replica.LOCK_NAME]


@pytest.mark.parametrize("naming", ["unnamed", "named"])
def test_after_a_kill_the_next_start_finds_no_partial_copy(model, disk_dir, naming):  # noqa: F811
    if naming == "unnamed" and not tmpfile_supported(disk_dir):
        pytest.skip("the file system of %s has no O_TMPFILE" % disk_dir)
    root = os.path.join(disk_dir, "replicas")
    child = start_slow_copy(model, root, naming)
    child.kill()
    child.communicate(timeout=30)
    node = os.path.join(root, "node0")
    left = [name for name in os.listdir(node) if replica._is_partial_name(name)]
    assert len(left) == (1 if naming == "named" else 0)
    copy, copied = replica.ensure_replica(model, root, [0])
    assert copied and sorted(os.listdir(node)) == sorted([replica.LOCK_NAME, os.path.basename(copy)])


def show_argv_and_note(model, replica_dir, *server_args):
    result = numa_pin("exec", "--node", "0", "--gpus", "none", "--model", model, "--page-cache", "replicate",
                      "--replica-dir", replica_dir, "--", sys.executable, "-c",
                      "import json, sys; print(json.dumps(sys.argv[1:]))", *server_args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def test_exec_starts_the_server_on_the_copy(model, disk_dir):  # noqa: F811
    root = os.path.join(disk_dir, "replicas")
    argv, note = show_argv_and_note(model, root, "--model", model)
    copy = replica.replica_path(root, model, [0])
    assert argv == ["--model", copy]
    assert "copied the model to %s" % copy in note
    argv, note = show_argv_and_note(model, root, "--model", model)
    assert argv == ["--model", copy] and "the model's copy is %s" % copy in note


def test_exec_falls_back_to_the_shared_model_and_says_why(model, disk_dir):  # noqa: F811
    argv, note = show_argv_and_note(model, os.path.join(disk_dir, "replicas"), "--model", "./elsewhere.gguf")
    assert argv == ["--model", "./elsewhere.gguf"]
    assert "NOT replicated, the server maps the shared model: page_cache replicate: no server argument" in note
