"""replica.py: per-node copies of a model, on this host's disk, and numa-pin exec using them."""
import json
import os
import sys
import threading

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa import pagecache, replica
from ansible_collections.inferops.numa.plugins.module_utils.numa.errors import NumaError

from tests.unit.test_cli import numa_pin
from tests.unit.test_pagecache import disk_dir, fincore_pages, write_file  # noqa: F401  (disk_dir: a fixture)

SIZE = 1 << 20


@pytest.fixture
def model(disk_dir):  # noqa: F811
    return write_file(os.path.join(disk_dir, "model.gguf"), SIZE)


def read_bytes(path):
    with open(path, "rb") as handle:
        return handle.read()


def test_the_copy_has_the_model_bytes_and_its_times_and_lives_under_the_node(model, disk_dir):  # noqa: F811
    root = os.path.join(disk_dir, "replicas")
    copy, copied = replica.ensure_replica(model, root, [0])
    assert copied
    assert os.path.dirname(copy) == os.path.join(root, "node0")
    assert copy.endswith("-model.gguf")
    assert read_bytes(copy) == read_bytes(model)
    assert os.stat(copy).st_mtime_ns == os.stat(model).st_mtime_ns


def test_a_fresh_copy_is_kept_and_a_changed_model_is_copied_again(model, disk_dir):  # noqa: F811
    root = os.path.join(disk_dir, "replicas")
    first, _ = replica.ensure_replica(model, root, [0])
    again, copied = replica.ensure_replica(model, root, [0])
    assert (again, copied) == (first, False)
    write_file(model, SIZE // 2)
    again, copied = replica.ensure_replica(model, root, [0])
    assert (again, copied) == (first, True)
    assert read_bytes(again) == read_bytes(model)


def test_the_copy_is_cached_on_the_plan_node_and_the_source_pages_are_dropped(model, disk_dir):  # noqa: F811
    copy, _ = replica.ensure_replica(model, os.path.join(disk_dir, "replicas"), [0])
    assert fincore_pages(model) == 0
    assert pagecache.file_residency(copy)["nodes"] == {"0": SIZE // pagecache.PAGE}


def test_instances_of_one_node_copy_once(model, disk_dir):  # noqa: F811
    root = os.path.join(disk_dir, "replicas")
    outcomes = []
    threads = [threading.Thread(target=lambda: outcomes.append(replica.ensure_replica(model, root, [0])))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(copied for _path, copied in outcomes) == [False, False, False, True]
    assert sorted(os.listdir(os.path.join(root, "node0"))) == [".lock", os.path.basename(outcomes[0][0])]


def test_models_of_the_same_name_and_node_sets_get_their_own_copies():
    one = replica.replica_path("/r", "/models/a/model.gguf", [1])
    other = replica.replica_path("/r", "/models/b/model.gguf", [1])
    spread = replica.replica_path("/r", "/models/a/model.gguf", [1, 0])
    assert one != other and one.startswith("/r/node1/") and other.startswith("/r/node1/")
    assert spread.startswith("/r/node0+1/")


def test_no_room_for_the_copy_is_an_error_that_names_the_fix(model, disk_dir, monkeypatch):  # noqa: F811
    statvfs = os.statvfs(disk_dir)
    full = os.statvfs_result((statvfs.f_bsize, statvfs.f_frsize, statvfs.f_blocks, 0, 0) + tuple(statvfs)[5:])
    monkeypatch.setattr(os, "statvfs", lambda path: full)
    with pytest.raises(NumaError, match="no room for a %d-byte replica.*free disk space" % SIZE):
        replica.ensure_replica(model, os.path.join(disk_dir, "replicas"), [0])


def test_a_directory_is_not_replicated(disk_dir):  # noqa: F811
    with pytest.raises(NumaError, match="copies model files"):
        replica.ensure_replica(disk_dir, os.path.join(disk_dir, "replicas"), [0])


def test_the_directory_comes_from_the_option_then_systemd(monkeypatch):
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/llama:/var/lib/other")
    assert replica.replica_root("/srv/replicas") == "/srv/replicas"
    assert replica.replica_root(None) == "/var/lib/llama"
    monkeypatch.delenv("STATE_DIRECTORY")
    with pytest.raises(NumaError, match="--replica-dir"):
        replica.replica_root(None)


def test_the_server_arguments_name_the_copy():
    argv = ["llama-server", "--model", "/m/model.gguf", "--lora=/m/model.gguf", "/m/model.gguf.bak"]
    assert replica.point_at_replicas(argv, {"/m/model.gguf": "/r/node1/x-model.gguf"}) == [
        "llama-server", "--model", "/r/node1/x-model.gguf", "--lora=/r/node1/x-model.gguf", "/m/model.gguf.bak"]
    with pytest.raises(NumaError, match="no server argument is the model path /m/other.gguf"):
        replica.point_at_replicas(argv, {"/m/other.gguf": "/r/node1/y-other.gguf"})


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
