"""numa-pin in-process: parsing, exec's placement and page-cache steps with the kernel calls faked, failure
modes, help. The commands run as processes are tests/integration/test_cli_processes.py."""

import json
import os

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.cli import numa_pin
from ansible_collections.inferops.numa.plugins.module_utils.numa.system import kernel
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.placement import Request, plan
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.tokens import substitute_tokens
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.topology import read

from tests.fixtures import sysfs


def _one_node_plan():
    return plan(read("/"), Request(node=0))


def test_strict_mode_refuses_to_run_unpinned(monkeypatch):
    def refuse(policy, nodes, allowed=None):
        raise kernel.KernelCallError("set_mempolicy", 1, "set_mempolicy(%s) failed: EPERM (seccomp)" % policy)

    monkeypatch.setattr(kernel, "set_mempolicy", refuse)
    monkeypatch.setattr(kernel, "set_cpu_affinity", lambda cpus, allowed=None: None)
    with pytest.raises(NumaError) as caught:
        numa_pin._apply(_one_node_plan(), read("/"), best_effort=False)
    assert caught.value.exit_code == numa_pin.EXIT_KERNEL_REFUSED
    assert "refusing to start the server unpinned" in str(caught.value) and "EPERM" in str(caught.value)


def test_best_effort_degrades_bind_to_preferred_then_nothing(monkeypatch):
    tried = []

    def refuse_bind(policy, nodes, allowed=None):
        tried.append(policy)
        if policy == "bind":
            raise kernel.KernelCallError("set_mempolicy", 22, "bind refused")

    monkeypatch.setattr(kernel, "set_mempolicy", refuse_bind)
    monkeypatch.setattr(kernel, "set_cpu_affinity", lambda cpus, allowed=None: None)
    notes = numa_pin._apply(_one_node_plan(), read("/"), best_effort=True)
    assert tried == ["bind", "preferred"]
    assert any("degraded to preferred" in note for note in notes)

    def refuse_all(policy, nodes, allowed=None):
        raise kernel.KernelCallError("set_mempolicy", 1, "refused")

    monkeypatch.setattr(kernel, "set_mempolicy", refuse_all)
    notes = numa_pin._apply(_one_node_plan(), read("/"), best_effort=True)
    assert notes[-1].startswith("best-effort: memory policy NOT set")


def test_port_token_without_port_base_is_an_error():
    with pytest.raises(NumaError, match="--port-base"):
        substitute_tokens(["--port", "{port}"], _one_node_plan().to_dict())


def test_tokens_leave_other_braces_alone():
    placement = _one_node_plan()
    assert substitute_tokens(["{threads}x{threads}", "{unknown}", "{}"], placement.to_dict()) == [
        "%dx%d" % (placement.threads, placement.threads), "{unknown}", "{}"]


def test_page_cache_trouble_is_a_note_after_the_placement_not_a_failure(monkeypatch, tmp_path):
    from ansible_collections.inferops.numa.plugins.module_utils.numa.act import pagecache

    model = tmp_path / "model.gguf"
    model.write_bytes(b"\0" * 8192)

    def refuse(path, local_nodes):
        raise NumaError("mincore was refused (EPERM) while scanning the page cache: a seccomp filter blocks it")

    monkeypatch.setattr(pagecache, "sample_residency", refuse)
    notes = numa_pin._settle_page_cache([str(model)], _one_node_plan(), "evict")
    assert notes == ["page cache NOT checked: mincore was refused (EPERM) while scanning the page cache: "
                     "a seccomp filter blocks it"]


def _looked(nodes):
    return {"nodes": nodes, "estimate": "sampled 688 of 4096 cached pages; node fractions within \u00b11 pp (99 %)"}


def test_evict_scans_every_page_only_once_the_sample_saw_remote_ones(monkeypatch):
    from ansible_collections.inferops.numa.plugins.module_utils.numa.act import pagecache

    evicted = []
    outcome = {"evicted_pages": 4096, "skipped_reason": None}
    monkeypatch.setattr(pagecache, "evict_remote", lambda path, local: evicted.append((path, local)) or outcome)
    monkeypatch.setattr(pagecache, "sample_residency", lambda path, local_nodes: _looked({"0": 4096}))
    assert numa_pin._settle_file("/m.gguf", {0}, "evict") == [] and evicted == []
    monkeypatch.setattr(pagecache, "sample_residency", lambda path, local_nodes: _looked({"0": 4090, "1": 6}))
    assert numa_pin._settle_file("/m.gguf", {0}, "evict") == [
        "page cache: dropped 4096 pages of /m.gguf cached on remote nodes"]
    assert evicted == [("/m.gguf", {0})]


def test_warn_names_the_sampled_remote_pages_and_the_bound(monkeypatch):
    from ansible_collections.inferops.numa.plugins.module_utils.numa.act import pagecache

    monkeypatch.setattr(pagecache, "sample_residency", lambda path, local_nodes: _looked({"0": 1000, "1": 3096}))
    assert numa_pin._settle_file("/m.gguf", {0}, "warn") == [
        "page cache: 3096 pages of /m.gguf sit on remote nodes (N0=1000, N1=3096; sampled 688 of 4096 cached pages; "
        "node fractions within \u00b11 pp (99 %))"]


def test_exec_applies_the_placement_before_looking_at_the_page_cache(monkeypatch, tmp_path):
    order = []
    monkeypatch.setattr(numa_pin, "_apply", lambda placement, topology, best_effort: order.append("apply") or [])
    monkeypatch.setattr(numa_pin, "_settle_page_cache", lambda models, placement, action: order.append("cache") or [])
    monkeypatch.setattr(os, "execvp", lambda file, argv: order.append("exec"))
    args, server_argv = numa_pin._parse(["exec", "--node", "0", "--model", str(tmp_path), "--", "/bin/true"])
    numa_pin.run_exec(args, server_argv)
    assert order == ["apply", "cache", "exec"]


def test_explain_reports_page_cache_trouble_beside_the_plan(tmp_path, monkeypatch, capsys):
    from ansible_collections.inferops.numa.plugins.module_utils.numa.act import pagecache

    root = sysfs.dual_socket_gpus().write(str(tmp_path / "root"))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"\1" * 8192)
    args, _ = numa_pin._parse(["explain", "--root", root, "--gpus", "none", "--model", str(model)])
    assert numa_pin.run_explain(args, []) == 0
    assert json.loads(capsys.readouterr().out)["page_cache"]["files"][0]["path"] == str(model)

    def hidden(paths):
        raise NumaError("cannot see the page cache of %s" % paths[0])

    monkeypatch.setattr(pagecache, "residency", hidden)
    assert numa_pin.run_explain(args, []) == 0
    explained = json.loads(capsys.readouterr().out)
    assert explained["page_cache"] == {"error": "cannot see the page cache of %s" % model, "action": "evict"}
    assert explained["mem_nodes"] == [0]


# --- hostile requests: one line, at once -------------------------------------------------------------------

HOSTILE_REQUESTS = {
    "a hundred million instances": (["--instances", "100000000"], "instances must be at most 8192, got 100000000"),
    "4000-digit instances": (["--instances", "9" * 4000], "instances must be at most 8192, got (a 13288-bit number)"),
    "commas for gpus": (["--gpus", ",,,"], "gpus entry 1 of 4 is empty"),
    "a GPU twice": (["--gpus", "81:00.0,81:00.0"], "gpus names GPU 0000:81:00.0 twice"),
    "replicate without a model": (["--page-cache", "replicate"], "page_cache replicate copies the model files"),
    "ports past 65535": (["--port-base", "65535", "--instances", "2"], "pick a port_base of at most 65534"),
    "a model of 5000 digits": (["--model-size", "9" * 5000], "has more than 40 digits"),
    "too few anchors": (["--instances", "2", "--anchors", "0"], "name 1 node(s) for 2 instance(s)"),
    "an anchor the host lacks": (["--instances", "2", "--anchors", "0,7"], "anchors name node(s) 7, which this host"),
}


@pytest.mark.parametrize("args, message", list(HOSTILE_REQUESTS.values()), ids=list(HOSTILE_REQUESTS))
def test_explain_refuses_a_hostile_request_in_one_line(tmp_path, capsys, args, message):
    root = sysfs.dual_socket_gpus().write(str(tmp_path))
    assert numa_pin.main(["explain", "--root", root] + args) == numa_pin.EXIT_BAD_REQUEST
    err = capsys.readouterr().err
    assert err.startswith("numa-pin: ") and err.count("\n") == 1 and message in err


@pytest.mark.parametrize("argv", [
    ["explain", "--instances", "9" * 5000],
    ["explain", "--instances", "0x10"],
    ["exec", "--instances", "two", "--", "true"],
    ["exec", "--gpus"],
    ["exec", "--page-cache", "copy", "--", "true"],
    ["audit", "--pid", "x"],
    ["audit", "--pid", "1", "--min-local-percent", "lots"],
    ["cost", "--rounds", "1.5"],
], ids=["5000 digits", "hex", "word", "no value", "bad choice", "pid word", "percent word", "fraction"])
def test_argparse_refusals_are_usage_and_one_error_line(capsys, argv):
    with pytest.raises(SystemExit) as stop:
        numa_pin.main(argv)
    assert stop.value.code == numa_pin.EXIT_BAD_REQUEST
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("usage: numa-pin")
    assert err.splitlines()[-1].startswith("numa-pin") and ": error: " in err.splitlines()[-1]


@pytest.mark.parametrize("command", ["explain", "audit", "cost", "metrics", "facts"])
def test_a_mistyped_option_shows_that_commands_usage(capsys, command):
    with pytest.raises(SystemExit) as stop:
        numa_pin.main([command, "--instnaces", "2"])
    assert stop.value.code == numa_pin.EXIT_BAD_REQUEST
    err = capsys.readouterr().err
    assert err.startswith("usage: numa-pin %s " % command), err
    assert err.splitlines()[-1] == "numa-pin %s: error: unrecognized arguments: --instnaces 2" % command


@pytest.mark.parametrize("word", ["9" * 5000, "1e3", "0x10", "-"])
def test_quick_parser_leaves_what_int_refuses_to_argparse(word):
    assert numa_pin._quick_parse(["exec", "--instances", word], ["true"]) is None


# --- help, version ------------------------------------------------------------------------------

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMANDS = ("facts", "explain", "exec", "audit", "cost", "metrics")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_of_every_command_has_help(command):
    subparsers = next(action for action in numa_pin._parser(command)._actions if action.dest == "command")
    actions = subparsers.choices[command]._actions
    assert len(actions) > 1
    assert [action.option_strings for action in actions if not (action.help or "").strip()] == []


@pytest.mark.parametrize("command", COMMANDS)
def test_every_commands_help_ends_with_its_exit_codes_and_an_example(capsys, command):
    with pytest.raises(SystemExit):
        numa_pin.main([command, "--help"])
    text = capsys.readouterr().out
    codes, example = numa_pin.COMMAND_HELP[command]
    assert "exit codes: " in text and text.rstrip().endswith("example:\n  %s" % example), text[-400:]
    assert example.startswith("numa-pin %s " % command)
