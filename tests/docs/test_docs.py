"""What ansible-doc shows: every filter documented with examples that render to what they say, every module
return key documented (no more, no fewer than a real run returns) with a sample, and the roles' defaults
written once.
"""

import json
import os
import random
import re
import subprocess
import sys

import pytest
import yaml
from ansible.release import __version__ as ANSIBLE_VERSION

from ansible_collections.inferops.numa.plugins.module_utils.numa.measure import cost
from ansible_collections.inferops.numa.plugins.modules import (
    numa_audit, numa_balancing, numa_cost, numa_facts, numa_governor, numa_plan, numa_weights)

from tests.ansible_compat import patch_module_args
from tests.fixtures import sysfs
from tests.tools import ansible_command
from tests.unit import test_cost_engine, test_governor

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILTER_DIR = os.path.join(REPO, "plugins", "filter")
# The filter plugins import ansible.errors, which switches this process's module code to controller mode (its
# warnings go to the display, not the result): their signatures are read in a process of their own.
SIGNATURES_SCRIPT = """
import inspect, json, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.inferops.numa.plugins.filter import numa_cost_report, numa_fleet_report, systemd_unit
filters = dict(systemd_unit.FilterModule().filters(), **numa_cost_report.FilterModule().filters())
filters.update(numa_fleet_report.FilterModule().filters())
print(json.dumps({name: [[p.name, p.default is inspect.Parameter.empty, None if p.default is inspect.Parameter.empty
                          else p.default] for p in inspect.signature(f).parameters.values()]
                  for name, f in filters.items()}))
"""
FILTERS = json.loads(subprocess.run([sys.executable, "-c", SIGNATURES_SCRIPT, os.path.join(REPO, "build")],
                                    stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout)
MODULES = {"numa_audit": numa_audit, "numa_balancing": numa_balancing, "numa_cost": numa_cost,
           "numa_facts": numa_facts, "numa_governor": numa_governor, "numa_plan": numa_plan,
           "numa_weights": numa_weights}


def _filter_doc(name):
    with open(os.path.join(FILTER_DIR, name + ".yml")) as handle:
        return yaml.safe_load(handle)


def _ansible_env():
    return dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")


# --- filters ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(FILTERS))
def test_each_filter_documents_exactly_its_parameters(name):
    doc = _filter_doc(name)["DOCUMENTATION"]
    assert doc["name"] == name
    parameters = FILTERS[name]
    expected = {("_input" if index == 0 else parameter): (required, default)
                for index, (parameter, required, default) in enumerate(parameters)}
    assert set(doc["options"]) == set(expected)
    for option, (required, default) in expected.items():
        documented = doc["options"][option]
        if required:
            assert documented.get("required") is True, option
        else:
            assert documented.get("default") == default and not documented.get("required"), option
    assert doc["positional"] == ", ".join(expected)


def test_ansible_doc_renders_every_filter_with_examples_and_its_return_value():
    names = ["inferops.numa." + name for name in sorted(FILTERS)]
    done = subprocess.run([ansible_command("ansible-doc"), "-t", "filter", "--json"] + names, cwd=REPO,
                          env=_ansible_env(), capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "[ERROR]" not in done.stderr, done.stderr
    rendered = json.loads(done.stdout)
    assert sorted(rendered) == names
    for name, entry in rendered.items():
        assert entry["doc"]["short_description"] and entry["doc"]["description"], name
        assert "inferops.numa.%s" % name.split(".")[-1] in entry["examples"], name
        assert entry["return"]["_value"]["description"], name


def _examples():
    """{filter: ({variable: template}, {variable: what its comment says it renders to})}."""
    examples = {}
    for name in sorted(FILTERS):
        text = _filter_doc(name)["EXAMPLES"]
        rendered, variable = {}, None
        for line in text.splitlines():
            match = re.match(r"^(\w+):", line)
            if match:
                variable = match.group(1)
            elif line.startswith("# => "):
                rendered[variable] = line[len("# => "):]
            elif line.startswith("#    ") and variable in rendered:  # a long result goes on over comment lines
                rendered[variable] += " " + line[len("#    "):].strip()
        expected = {key: yaml.safe_load(value) for key, value in rendered.items()}
        examples[name] = (yaml.safe_load(text), expected)
    return examples


EXAMPLES_PLAYBOOK = """\
- name: Render every filter's examples
  hosts: localhost
  connection: local
  gather_facts: false
  vars_files:
    - examples.yml
  tasks:
    - name: Keep what they render to
      ansible.builtin.copy:
        content: "{{ examples | to_json }}"
        dest: "{{ out }}"
        mode: "0644"
"""


def test_every_filter_example_renders_to_what_its_comment_says(tmp_path):
    examples = _examples()
    assert all(templates for templates, _ in examples.values())
    assert sum(len(expected) for _, expected in examples.values()) >= len(examples) - 1
    (tmp_path / "examples.yml").write_text(yaml.safe_dump({"examples": {name: templates for name, (templates, _)
                                                                        in examples.items()}}))
    (tmp_path / "render.yml").write_text(EXAMPLES_PLAYBOOK)
    out = tmp_path / "rendered.json"
    done = subprocess.run([ansible_command("ansible-playbook"), "-i", "localhost,", str(tmp_path / "render.yml"),
                           "-e", "out=%s" % out, "-e", "ansible_python_interpreter=" + sys.executable],
                          cwd=REPO, env=_ansible_env(), capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    rendered = json.loads(out.read_text())
    for name, (templates, expected) in examples.items():
        assert set(rendered[name]) == set(templates), name
        for variable, value in expected.items():
            assert rendered[name][variable] == _as_templated(value), (name, variable)
    assert rendered["numa_cost_report"]["report"]["host_count"] == 1


def _as_templated(value):
    """A value as a template that evaluates to it comes out: before ansible-core 2.19, a number as its text."""
    old_core = tuple(int(part) for part in ANSIBLE_VERSION.split(".")[:2]) < (2, 19)
    if old_core and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


# --- modules ------------------------------------------------------------------------------------------

def _returns(module):
    return yaml.safe_load(module.RETURN)


def _leaves(keys, path=""):
    for key, spec in keys.items():
        if "contains" in spec:
            yield from _leaves(spec["contains"], path + key + ".")
        else:
            yield path + key, spec


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_return_key_has_a_description_and_a_sample(name):
    leaves = dict(_leaves(_returns(MODULES[name])))
    assert leaves
    assert [key for key, spec in leaves.items() if not spec.get("description") or "sample" not in spec] == []


def _run_module(module, args, capsys):
    with patch_module_args(args), pytest.raises(SystemExit) as stop:
        module.main()
    assert stop.value.code == 0
    return json.loads(capsys.readouterr().out)


def _keys(result, documented):
    """The result's keys, and its dicts' keys where RETURN details them (contains) - as a set of dotted paths."""
    found = set()
    for key, value in result.items():
        found.add(key)
        spec = documented.get(key)
        if spec and "contains" in spec:
            items = value if isinstance(value, list) else [value]
            for item in items:
                found.update(key + "." + inner for inner in _keys(item, spec["contains"]))
    return found


def _documented(keys, path=""):
    found = set()
    for key, spec in keys.items():
        found.add(path + key)
        found.update(_documented(spec.get("contains", {}), path + key + "."))
    return found


def _common(result):
    """What AnsibleModule adds to every result."""
    return {key: value for key, value in result.items() if key not in ("changed", "invocation", "warnings")}


def test_numa_facts_and_numa_plan_return_exactly_what_they_document(tmp_path, capsys):
    root = sysfs.dual_socket_gpus().write(str(tmp_path))
    facts = _common(_run_module(numa_facts, {"root": root}, capsys))
    assert _keys(facts, _returns(numa_facts)) == _documented(_returns(numa_facts))
    planned = _common(_run_module(numa_plan, {"root": root, "instances": 2, "instance": 1, "model_size": "14G",
                                              "port_base": 8080}, capsys))
    assert _keys(planned, _returns(numa_plan)) == _documented(_returns(numa_plan))


def test_numa_audit_of_processes_returns_what_it_documents(capsys):
    returns = _returns(numa_audit)
    cpus = ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0)))
    plan = {"policy": "bind", "mem_nodes": sorted(int(node[4:]) for node in os.listdir("/sys/devices/system/node")
                                                  if re.match(r"^node\d+$", node)), "cpulist": cpus}
    report = _common(_run_module(numa_audit, {"pids": [os.getpid()], "plan": plan, "min_local_percent": 0},
                                 capsys))
    for_pids = {key for key, spec in returns.items()
                if spec["returned"] in ("always", "with O(unit) or O(pids)")}
    assert {key.split(".")[0] for key in _keys(report, returns)} == for_pids
    assert _keys(report, returns) == {key for key in _documented(returns) if key.split(".")[0] in for_pids}


def test_numa_cost_returns_what_it_documents(capsys, monkeypatch):
    runner, _ = test_cost_engine.fake_measurements(test_cost_engine.LAT, test_cost_engine.BW)
    measure = cost.measure

    def two_node_measure(facts, options, progress=None):  # the real engine on a two-node host, its children faked
        return measure(test_cost_engine.two_nodes(), options, runner=runner, rng=random.Random(1), progress=progress)
    monkeypatch.setattr(cost, "measure", two_node_measure)
    result = _common(_run_module(numa_cost, {"buffer_mb": 1, "window_seconds": 0.1}, capsys))
    assert _keys(result, _returns(numa_cost)) == _documented(_returns(numa_cost)) - {"recorded"}
    monkeypatch.setattr(numa_cost, "record", lambda result: "/var/lib/inferops-numa/cost.json")
    result = _run_module(numa_cost, {"buffer_mb": 1, "window_seconds": 0.1, "record": True}, capsys)
    assert result["changed"] and _keys(_common(result), _returns(numa_cost)) == _documented(_returns(numa_cost))


def test_numa_weights_returns_what_it_documents(tmp_path, capsys):
    root = sysfs.snc2_cxl().write(str(tmp_path / "root"))
    result = _run_module(numa_weights, {"root": root, "record_dir": str(tmp_path / "none")}, capsys)
    assert result["changed"] and result["source"] == "hmat"
    assert _keys(_common(result), _returns(numa_weights)) == _documented(_returns(numa_weights))


def test_numa_governor_returns_what_it_documents(tmp_path, capsys):
    root = test_governor.host(tmp_path)
    result = _run_module(numa_governor, {"root": root, "governor": "performance"}, capsys)
    assert result["changed"] and result["policies"]["policy1"]["after"] == "performance"
    assert _keys(_common(result), _returns(numa_governor)) == _documented(_returns(numa_governor))


# --- roles --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("role", ["numa_host", "inference_service"])
def test_role_variables_documented_with_the_defaults_the_role_has(role):
    """defaults/main.yml gives a role variable its value, meta/argument_specs.yml documents it: one value."""
    base = os.path.join(REPO, "roles", role)
    with open(os.path.join(base, "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle)
    with open(os.path.join(base, "meta", "argument_specs.yml")) as handle:
        options = yaml.safe_load(handle)["argument_specs"]["main"]["options"]
    assert set(options) == set(defaults)
    assert {name: spec.get("default") for name, spec in options.items()} == defaults


def test_role_readme_gives_each_entry_key_the_argument_specs_default():
    base = os.path.join(REPO, "roles", "inference_service")
    with open(os.path.join(base, "meta", "argument_specs.yml")) as handle:
        entry = yaml.safe_load(handle)["argument_specs"]["main"]["options"]["inference_service_list"]["options"]
    with open(os.path.join(base, "README.md")) as handle:
        rows = re.findall(r"^\| (`\w+`(?: / `\w+`)?) \| ([^|]*) \|", handle.read(), re.MULTILINE)
    shown = {}
    for names, defaults in rows:
        names = re.findall(r"`(\w+)`", names)
        cells = defaults.split(" / ") if len(names) > 1 else [defaults]
        shown.update(zip(names, cells))
    for name, spec in entry.items():
        assert name in shown, name
        if "default" in spec:
            assert shown[name] == "`%s`" % json.dumps(spec["default"]).strip('"'), name
        elif not spec.get("required"):
            assert shown[name].startswith("`null`") or not shown[name].startswith("`"), name
