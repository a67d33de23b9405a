"""numa-pin's commands as processes, started as the installed launcher starts them (a plain package named
numa): explain, audit, facts, exec, --version and --help. The in-process tests are tests/unit/test_cli.py."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.cli import numa_pin as numa_pin_cli
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.placement import Request, plan
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.tokens import TOKENS
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.topology import read

from tests.fixtures import sysfs
from tests.unit.test_cli import HOSTILE_REQUESTS, REPO


PACKAGE_PARENT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                              "plugins", "module_utils")


def numa_pin(*args, **kwargs):
    """Run the helper the way the installed launcher does: a plain package named numa."""
    env = dict(os.environ, PYTHONPATH=PACKAGE_PARENT)
    return subprocess.run([sys.executable, "-m", "numa"] + list(args), capture_output=True, text=True,
                          env=env, timeout=60, check=False, **kwargs)


def test_explain_on_a_captured_gpu_box_picks_the_gpu_node(tmp_path):
    root = sysfs.dual_socket_gpus().write(str(tmp_path))
    result = numa_pin("explain", "--root", root, "--gpus", "1", "--model-size", "14G", "--port-base", "8080")
    assert result.returncode == 0, result.stderr
    explained = json.loads(result.stdout)
    assert explained["node"] == 1 and explained["mem_nodes"] == [1] and explained["policy"] == "bind"
    assert explained["gpus"] == ["0000:81:00.0"]
    assert explained["env"]["CUDA_VISIBLE_DEVICES"] == "0" and explained["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert explained["cpulist"] == "40-79,120-159" and explained["threads"] == 80
    assert explained["port"] == 8080
    assert any("GPU" in reason for reason in explained["reasons"])


def test_explain_model_size_from_a_path(tmp_path):
    root = sysfs.dual_socket_gpus().write(str(tmp_path / "root"))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"\0" * 4096)
    explained = json.loads(numa_pin("explain", "--root", root, "--model-size", str(model), "--gpus", "none").stdout)
    assert explained["inputs"]["model_size"] == 4096


def test_explain_impossible_request_is_exit_2_with_the_sizes(tmp_path):
    root = sysfs.dual_socket_gpus().write(str(tmp_path))
    result = numa_pin("explain", "--root", root, "--model-size", "2T", "--on-unfit", "fail")
    assert result.returncode == numa_pin_cli.EXIT_BAD_REQUEST
    assert result.stderr.startswith("numa-pin: ") and "TiB" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [
    ["explain", "--node", "two"],
    ["explain", "--instances", "2", "--instance", "2"],
    ["explain", "--reserve-cpus", "0-x"],
    ["explain", "--model-size", "fourteen gigs"],
    ["exec", "--node", "0"],
    ["facts", "--", "true"],
])
def test_bad_arguments_are_clear_errors(args):
    result = numa_pin(*args)
    assert result.returncode == numa_pin_cli.EXIT_BAD_REQUEST, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip()


@pytest.mark.parametrize("args, why", [
    (["audit"], "not neither"),
    (["audit", "--pid", "1", "--unit", "x.service"], "not both"),
])
def test_audit_wants_pids_or_a_unit(args, why):
    result = numa_pin(*args)
    assert result.returncode == numa_pin_cli.EXIT_BAD_REQUEST and why in result.stderr, result.stderr


def test_audit_of_a_pid_reports_where_its_memory_is(trusted_dir):
    plan_file = pathlib.Path(trusted_dir, "plan.json")  # in /tmp, which anyone may write, it would be refused
    plan_file.write_text(json.dumps({"policy": "preferred", "mem_nodes": [0], "cpus": sorted(os.sched_getaffinity(0))}))
    result = numa_pin("audit", "--pid", str(os.getpid()), "--plan-file", str(plan_file))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [process["pid"] for process in report["processes"]] == [os.getpid()]
    assert report["expected_mem_nodes"] == [0] and report["resident_bytes"] > 0


def test_facts_prints_the_reader_json(tmp_path):
    root = sysfs.amd_nps4().write(str(tmp_path))
    assert json.loads(numa_pin("facts", "--root", root).stdout) == json.loads(json.dumps(read(root)))


def test_exec_pins_this_process_and_keeps_its_pid():
    probe = ("import json, os, sys\n"
             "status = dict(l.split(':', 1) for l in open('/proc/self/status') if ':' in l)\n"
             "heap = [l for l in open('/proc/self/numa_maps').read().splitlines() if ' heap' in l]\n"
             "print(json.dumps([os.getpid(), status['Cpus_allowed_list'].strip(), heap, sys.argv[1:]]))\n")
    process = subprocess.Popen([sys.executable, "-m", "numa", "exec", "--node", "0", "--port-base", "9000", "--",
                                sys.executable, "-c", probe, "{threads}", "{port}", "{cpulist}", "{\"n\": {node}}"],
                               env=dict(os.environ, PYTHONPATH=PACKAGE_PARENT), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    pid, allowed, heap, argv = json.loads(out)
    expected = plan(read("/"), Request(node=0))
    assert int(pid) == process.pid  # exec'd, not forked
    assert allowed == expected.cpulist
    assert heap and all(" bind:0 " in line for line in heap)
    assert argv == [str(expected.threads), "9000", expected.cpulist, '{"n": 0}']
    assert err.count("\n") == 1 and "bind memory on node(s) 0" in err


def test_exec_of_a_missing_server_says_so():
    result = numa_pin("exec", "--node", "0", "--", "/nonexistent/llama-server")
    assert result.returncode == numa_pin_cli.EXIT_NOT_FOUND
    assert "cannot exec '/nonexistent/llama-server'" in result.stderr


@pytest.mark.parametrize("args, message", [HOSTILE_REQUESTS[name] for name in (
    "a hundred million instances", "commas for gpus", "replicate without a model")])
def test_exec_refuses_a_hostile_request_before_starting_anything(tmp_path, args, message):
    marker = tmp_path / "ran"
    result = numa_pin("exec", *args, "--", "touch", str(marker))
    assert result.returncode == numa_pin_cli.EXIT_BAD_REQUEST and not marker.exists()
    assert result.stderr.startswith("numa-pin: ") and result.stderr.count("\n") == 1 and message in result.stderr


def test_version_is_the_collections():
    with open(os.path.join(REPO, "galaxy.yml")) as handle:
        galaxy_version = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("version:"))
    assert numa_pin_cli.VERSION == galaxy_version
    result = numa_pin("--version")
    assert result.returncode == 0 and result.stdout == "numa-pin %s (inferops.numa)\n" % galaxy_version


def test_help_gives_the_exit_codes_and_two_examples_that_parse():
    result = numa_pin("--help")
    assert result.returncode == 0
    for code, meaning in ((0, "ok"), (numa_pin_cli.EXIT_AUDIT_FAILED, "audit below target"),
                          (numa_pin_cli.EXIT_BAD_REQUEST, "bad request"), (numa_pin_cli.EXIT_KERNEL_REFUSED, "the kernel refused"),
                          (numa_pin_cli.EXIT_NOT_FOUND, "server not found")):
        assert "%d %s" % (code, meaning) in " ".join(result.stdout.split())
    for example in (numa_pin_cli.EXPLAIN_EXAMPLE, numa_pin_cli.EXEC_EXAMPLE):
        assert "  " + example + "\n" in result.stdout
        words = example.split()
        assert words[0] == "numa-pin"
        args, server = numa_pin_cli._parse(words[1:])
        assert args.command == words[1] and (server != []) == (words[1] == "exec")


def test_exec_help_shows_the_server_command_and_every_token():
    result = numa_pin("exec", "--help")
    assert result.returncode == 0
    usage = result.stdout.split("\n\n")[0]
    assert usage.rstrip().endswith("-- SERVER [ARGS...]")
    for token in TOKENS:
        assert "{%s}" % token in result.stdout, token
    assert numa_pin_cli.EXEC_EXAMPLE in result.stdout
