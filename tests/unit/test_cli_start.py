"""numa-pin's lean start: the quick parser agrees with argparse, the JSON printer with json, and a
service start imports none of the heavy standard modules."""

import contextlib
import io
import json
import os

import pytest
from hypothesis import event, given, settings, strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.cli import numa_pin
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs import request
from ansible_collections.inferops.numa.plugins.module_utils.numa.act import unit_text
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.placement import Request, plan
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.topology import read

from tests.fixtures import sysfs

MACHINES = [sysfs.dual_socket_gpus, sysfs.amd_nps4, sysfs.grace_like, sysfs.cxl_memory_node, sysfs.vm_without_nodes,
            sysfs.cgroup_restricted]
PACKAGE_PARENT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                              "plugins", "module_utils")


def argparse_result(own, server_argv):
    """What _parse's argparse path makes of the command line: its vars, or the exit code it stops with."""
    parser = numa_pin._parser(own[0] if own else None)
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            args = parser.parse_args(own)
            if (args.command == "exec") != bool(server_argv):
                return "error"
        except SystemExit as exc:
            return "exit %s" % exc.code
    return vars(args)


def quick_result(own, server_argv):
    args = numa_pin._quick_parse(own, server_argv)
    return None if args is None else vars(args)


EVERY_FLAG = sorted({option.flag for option in request.OPTIONS} | {option.negative_flag for option in request.OPTIONS
                                                                    if option.kind == "bool"}
                    | {"--root", "--best-effort", "--no-best-effort", "--nod", "--node=0", "-h", "--help", "-x"})
WORDS = ["0", "1", "-1", "x", "", "auto", "bind", "evict", "socket", "12G", "10%+1G", "/m.gguf", "0,1", "-", " 2"]
SERVER = ["/bin/true", "-t", "{threads}"]


def _sample_values(option):
    """Values of the kind a unit writes for ``option``, some of them ones the planner later refuses."""
    if option.choices:
        return list(option.choices)
    return {"int": ["0", "2", "-1"], "list": ["/m.gguf"], "path": ["/var/x"]}.get(option.kind, ["0", "1", "14G", "0,1",
                                                                                           "10%+1G", "auto"])


@st.composite
def unit_lines(draw):
    """A line like the ones a unit's ExecStart= hands numa-pin: the quick parser's own ground, so the property
    below is about something (a line of random words is mostly left to argparse)."""
    words = []
    for option in draw(st.lists(st.sampled_from(request.OPTIONS), max_size=6, unique_by=lambda option: option.name)):
        if option.kind == "bool":
            words.append(draw(st.sampled_from([option.flag, option.negative_flag])))
        else:
            words += [option.flag, draw(st.sampled_from(_sample_values(option)))]
    command = draw(st.sampled_from(["exec", "explain"]))
    return command, words, SERVER if command == "exec" else []


@st.composite
def random_lines(draw):
    return (draw(st.sampled_from(["exec", "explain", "facts", "audit", "--help", "bogus"])),
            draw(st.lists(st.one_of(st.sampled_from(EVERY_FLAG), st.sampled_from(WORDS)), max_size=7)),
            draw(st.sampled_from([[], SERVER])))


@settings(max_examples=400, deadline=None)
@given(line=st.one_of(unit_lines(), random_lines()))
def test_a_line_the_quick_parser_takes_is_what_argparse_makes_of_it(line):
    command, rest, server = line
    own = [command] + rest
    quick = quick_result(own, server)
    event("reached: the quick parser took the line" if quick is not None else "not reached: left to argparse")
    if quick is not None:
        assert quick == argparse_result(own, server)


def test_the_quick_parser_takes_every_flag_a_unit_writes():
    every = {"node": "1", "gpus": "none", "model_size": "14G", "model": ["/srv/a.gguf", "/srv/b.gguf"],
             "memory_headroom": "10%+1G", "smt": False, "cores": "fast", "reserve_cpus": "0,1", "scope": "socket",
             "instances": 2, "instance": 1, "policy": "bind", "on_unfit": "fail", "page_cache": "replicate",
             "replica_dir": "/var/x", "port_base": 8080, "anchors": "0,1", "engine": "sglang",
             "container_runtime": "podman"}
    assert set(every) == set(request.BY_NAME)
    flags = unit_text.request_flags({name: value for name, value in every.items() if name != "model"})
    for path in every["model"]:
        flags += ["--model", path]
    own = ["exec"] + flags + ["--best-effort"]
    quick = quick_result(own, ["llama-server"])
    assert quick is not None and quick == argparse_result(own, ["llama-server"])
    assert quick["model"] == every["model"] and quick["instances"] == 2 and quick["smt"] is False
    assert quick_result(["facts", "--root", "/x"], []) == argparse_result(["facts", "--root", "/x"], [])


@pytest.mark.parametrize("own, server", [
    (["exec", "--nod", "0"], ["true"]),          # an abbreviation: argparse resolves it
    (["exec", "--node=0"], ["true"]),
    (["exec", "--node", "-1"], ["true"]),        # argparse decides whether "-1" is a value
    (["exec", "--instances", "two"], ["true"]),  # argparse words the error
    (["exec", "--policy", "fast"], ["true"]),
    (["exec", "--model"], ["true"]),
    (["exec", "--node", "0"], []),               # no server: argparse's error
    (["facts"], ["true"]),
    (["exec", "--help"], ["true"]),
    (["audit", "--pid", "1"], []),
])
def test_anything_else_is_left_to_argparse(own, server):
    assert numa_pin._quick_parse(own, server) is None


def printed(data):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        numa_pin._print_json(data)
    return out.getvalue()


JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6),
              st.sampled_from(["", "plain", 'q"uote', "back\\slash", "\x7f", "tab\t", "é", "0-3,8"])),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(st.text(max_size=4), inner, max_size=4),
                            st.dictionaries(st.integers(0, 9), inner, max_size=3),
                            st.dictionaries(st.sampled_from(["0", "1", "17"]), st.integers(), max_size=3)),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(JSONISH)
def test_printed_json_is_json_dumps_byte_for_byte(data):
    assert printed(data) == json.dumps(data, indent=2, sort_keys=True) + "\n"


@pytest.mark.parametrize("machine", MACHINES)
def test_printed_facts_are_json_dumps_byte_for_byte(tmp_path, machine):
    facts = read(machine().write(str(tmp_path)))
    assert printed(facts) == json.dumps(facts, indent=2, sort_keys=True) + "\n"


def plan_or_error(topology, options):
    try:
        return plan(topology, Request(**options)).to_dict()
    except NumaError as exc:
        return str(exc)


@pytest.mark.parametrize("machine", MACHINES)
def test_the_plan_only_read_plans_as_the_full_one(tmp_path, machine):
    root = machine().write(str(tmp_path))
    full, lean = read(root), read(root, plan_only=True)
    # NICs stay: the per-GPU map names each GPU's NICs at every start.
    assert lean["nics"] == full["nics"] and lean["nvme"] == [] and lean["cpus"]["caches"] == {}
    assert set(lean["kernel"]) == {"weighted_interleave"}
    for options in ({}, {"gpus": "none", "model_size": "20G"}, {"scope": "socket", "policy": "interleave"},
                    {"instances": 3, "instance": 2, "smt": False, "model_size": "1T"}, {"gpus": 1, "node": 1}):
        assert plan_or_error(lean, options) == plan_or_error(full, options), options


HEAVY = {"argparse", "re", "typing", "dataclasses", "fractions", "decimal", "json", "enum", "inspect", "shutil"}
