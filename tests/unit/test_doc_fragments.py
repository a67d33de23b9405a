"""Module documentation written once, and held to the code: the root option every host module takes comes from
plugins/doc_fragments/host_root.py and its spec from plugins/module_utils/numa_specs.py, not from a copy in each
module; the modules that only read share its attributes; every module's DOCUMENTATION options are its argument
spec (names, types, choices, defaults, suboptions), whose choices are the code's tables; the collection's action
group holds exactly the modules that take root; and the texts that restate a table for people (the role's
argument specs and README, the README's flags) name every choice of it."""

import ast
import importlib
import os
import re

import pytest
import yaml

from ansible_collections.inferops.numa.plugins.doc_fragments import host_root
from ansible_collections.inferops.numa.plugins.module_utils.numa.base import engines
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs import gate, judging, request
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs.service_entry import LAYOUTS
from ansible_collections.inferops.numa.plugins.module_utils.numa.watch import metrics
from ansible_collections.inferops.numa.plugins.module_utils.numa_specs import host_root_argument_spec

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULES = os.path.join(REPO, "plugins", "modules")
ROLE = os.path.join(REPO, "roles", "inference_service")
NAMES = sorted(name[:-3] for name in os.listdir(MODULES) if name.endswith(".py"))
# The keys of an option both an argument spec and its documentation give; the rest (description, no_log) is one's.
SPEC_KEYS = ("type", "elements", "choices", "default", "required")
FRAGMENT_OPTIONS = yaml.safe_load(host_root.ModuleDocFragment.DOCUMENTATION)["options"]


def _documentation(name):
    with open(os.path.join(MODULES, name + ".py")) as handle:
        tree = ast.parse(handle.read())
    (text,) = [node.value.value for node in tree.body if isinstance(node, ast.Assign)
               and [target.id for target in node.targets if isinstance(target, ast.Name)] == ["DOCUMENTATION"]]
    return yaml.safe_load(text)


class _Spec(Exception):
    """Raised by a stand-in AnsibleModule with the argument spec main() gave it: no module runs."""


def _argument_spec(name, monkeypatch):
    """The argument spec the module's main() builds; None for a module without one (an action's documentation)."""
    module = importlib.import_module("ansible_collections.inferops.numa.plugins.modules." + name)
    if not hasattr(module, "main"):
        return None

    def stand_in(argument_spec, **_other):
        raise _Spec(argument_spec)
    monkeypatch.setattr(module, "AnsibleModule", stand_in)
    with pytest.raises(_Spec) as caught:
        module.main()
    return caught.value.args[0]


def _typing(spec):
    """An option's spec or documentation as the keys both give, with the defaults Ansible assumes filled in."""
    typed = {"type": spec.get("type", "str"), "required": bool(spec.get("required", False))}
    for key in ("elements", "choices", "default"):
        if spec.get(key) is not None:
            typed[key] = list(spec[key]) if key == "choices" else spec[key]
    return typed


def _differences(documented, spec, where=""):
    """Every option the documentation and the argument spec do not give alike, suboptions included."""
    found = ["%s%s: documented only" % (where, name) for name in sorted(set(documented) - set(spec))]
    found += ["%s%s: in the argument spec only" % (where, name) for name in sorted(set(spec) - set(documented))]
    for name in sorted(set(documented) & set(spec)):
        if _typing(documented[name]) != _typing(spec[name]):
            found.append("%s%s: documented %s, spec %s" % (where, name, _typing(documented[name]), _typing(spec[name])))
        found += _differences(documented[name].get("suboptions") or {}, spec[name].get("options") or {},
                              "%s%s." % (where, name))
    return found


def _takes_root(name, monkeypatch):
    return "root" in (_argument_spec(name, monkeypatch) or {})


# --- the root option: one documentation, one spec ---------------------------------------------------------------

def test_the_root_fragment_documents_the_root_spec():
    assert _differences(FRAGMENT_OPTIONS, host_root_argument_spec()) == []


@pytest.mark.parametrize("name", NAMES)
def test_a_module_taking_root_takes_the_paired_spec_and_documents_it_with_the_fragment_only(name, monkeypatch):
    doc = _documentation(name)
    fragments = doc.get("extends_documentation_fragment") or []
    assert "root" not in (doc.get("options") or {}), name
    spec = _argument_spec(name, monkeypatch) or {}
    assert ("inferops.numa.host_root" in fragments) == ("root" in spec), name
    if "root" in spec:
        assert spec["root"] == host_root_argument_spec()["root"], name


@pytest.mark.parametrize("name", NAMES)
def test_no_module_restates_the_read_only_attributes(name):
    attributes = _documentation(name).get("attributes") or {}
    read_only = ({"support": "full"}, {"support": "none"}, ["linux"])
    spelled = (attributes.get("check_mode"), attributes.get("diff_mode"),
               (attributes.get("platform") or {}).get("platforms"))
    assert spelled != read_only, name


def test_the_numa_action_group_is_the_modules_taking_root(monkeypatch):
    """module_defaults: group/inferops.numa.numa: {root: ...} reaches every module that takes root, and no module
    that would refuse it."""
    with open(os.path.join(REPO, "meta", "runtime.yml")) as handle:
        groups = yaml.safe_load(handle)["action_groups"]
    assert groups == {"numa": [name for name in NAMES if _takes_root(name, monkeypatch)]}


# --- each module's documentation is its argument spec, and the spec the code's tables -----------------------------

@pytest.mark.parametrize("name", NAMES)
def test_a_modules_documentation_is_its_argument_spec(name, monkeypatch):
    spec = _argument_spec(name, monkeypatch)
    if spec is None:
        pytest.skip("an action's documentation: no argument spec on the host")
    doc = _documentation(name)
    documented = dict(doc.get("options") or {})
    if "inferops.numa.host_root" in (doc.get("extends_documentation_fragment") or []):
        documented.update(FRAGMENT_OPTIONS)
    assert _differences(documented, spec) == []


def _options(name, *path):
    options = _documentation(name)["options"]
    for step in path:
        options = options[step]["suboptions"]
    return options


def test_the_documented_choices_are_the_code_tables():
    assert _options("numa_plan")["engine"]["choices"] == list(engines.ENGINES)
    assert _options("numa_plan")["policy"]["choices"] == list(request.CHOICES["policy"])
    instance = _options("numa_rollout", "services", "instances")
    assert instance["engine"]["choices"] == list(engines.ENGINES)
    assert instance["ab_gate"]["suboptions"]["api"]["choices"] == ["auto"] + list(engines.APIS)
    assert {key: value.get("choices") for key, value in instance["audit"]["suboptions"].items()} == {
        option.name: list(option.choices) if option.choices else None for option in judging.OPTIONS}


def test_numa_metrics_names_every_layout_it_plans():
    description = " ".join(_documentation("numa_metrics")["description"])
    assert [layout for layout in LAYOUTS if "C(%s)" % layout not in description] == []


# --- the role and the README, restating the tables for people ------------------------------------------------------

def _role_entry_options():
    with open(os.path.join(ROLE, "meta", "argument_specs.yml")) as handle:
        spec = yaml.safe_load(handle)["argument_specs"]["main"]["options"]
    return spec["inference_service_list"]["options"]


def test_the_roles_on_drift_is_the_metrics_timers():
    on_drift = _role_entry_options()["on_drift"]
    assert (on_drift["choices"], on_drift["default"]) == (list(metrics.ON_DRIFT), metrics.DEFAULT_SETTINGS["on_drift"])


def test_the_roles_ab_gate_is_the_gates_table():
    documented = _role_entry_options()["ab_gate"]["options"]
    assert {name: _typing(value) for name, value in documented.items()} == {
        name: _typing(value) for name, value in gate.argument_spec().items()}


# A request option a service entry spells under another key: the container's runtime is its container entry's.
ROLE_KEYS = {"container_runtime": "container"}


def _readme_rows(path):
    """Each `name` of a Markdown table's first column: the rest of its row."""
    with open(path) as handle:
        return dict(re.findall(r"^\| `([\w.]+)` \|(.*)$", handle.read(), re.MULTILINE))


@pytest.mark.parametrize("option", [option for option in request.OPTIONS if option.choices], ids=lambda o: o.name)
def test_the_roles_readme_names_every_choice(option):
    row = _readme_rows(os.path.join(ROLE, "README.md"))[ROLE_KEYS.get(option.name, option.name)]
    assert [choice for choice in option.choices if "`%s`" % choice not in row] == []


@pytest.mark.parametrize("option", [option for option in request.OPTIONS if option.choices], ids=lambda o: o.name)
def test_the_readmes_request_flags_give_every_choice(option):
    with open(os.path.join(REPO, "README.md")) as handle:
        (given,) = re.findall(r"`%s ([^`|\s]+(?:\|[^`|\s]+)+)`" % re.escape(option.flag), handle.read())
    assert given.split("|") == list(option.choices)


def test_docs_engines_has_a_row_for_every_engine_record():
    rows = _readme_rows(os.path.join(REPO, "docs", "engines.md"))
    assert [name for name in engines.ENGINES if name not in rows] == []


# --- more texts that restate the code's rules: checked against what the code does, not against a copy ----------------

@pytest.mark.parametrize("option", [option for option in request.OPTIONS if option.choices], ids=lambda o: o.name)
def test_docs_placement_rows_name_every_choice(option):
    """docs/placement.md's request table restates the same tables (its policy row missed weighted_interleave once)."""
    rows = _readme_rows(os.path.join(REPO, "docs", "placement.md"))
    assert "policy" in rows and "engine" in rows  # the table is there: a missing row below is no list to check
    if option.name in rows:
        assert [choice for choice in option.choices if "`%s`" % choice not in rows[option.name]] == []


def test_numa_plans_returned_policy_is_described_with_the_kernels_names():
    """The plan returns the kernel's name of a policy (weighted-interleave), one per policy a request may ask for."""
    from ansible_collections.inferops.numa.plugins.module_utils.numa.system import kernel
    returned = [choice.replace("_", "-") for choice in request.CHOICES["policy"] if choice != "auto"]
    assert set(returned) <= set(kernel.POLICY_MODES)
    with open(os.path.join(MODULES, "numa_plan.py")) as handle:
        tree = ast.parse(handle.read())
    (text,) = [node.value.value for node in tree.body if isinstance(node, ast.Assign)
               and [target.id for target in node.targets if isinstance(target, ast.Name)] == ["RETURN"]]
    described = yaml.safe_load(text)["plan"]["contains"]["policy"]["description"]
    named = re.search(r"one of ([\w, -]+)\.$", described).group(1).replace(" and ", ", ").split(", ")
    assert named == returned


def test_the_roles_readme_and_argument_specs_name_every_layout():
    assert _role_entry_options()["layout"]["choices"] == list(LAYOUTS)
    row = _readme_rows(os.path.join(ROLE, "README.md"))["layout"]
    assert [layout for layout in LAYOUTS if "`%s`" % layout not in row] == []


def _accepted_punctuation():
    """The punctuation a service name may hold, asked of the code itself (act/unit_text.unit_prefix)."""
    import string
    from ansible_collections.inferops.numa.plugins.module_utils.numa.act import unit_text
    from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
    accepted = set()
    for char in string.punctuation + " ":
        try:
            unit_text.unit_prefix("a%sb" % char)
        except NumaError:
            continue
        accepted.add(char)
    return accepted, unit_text


def test_every_text_of_the_service_name_rule_allows_what_the_code_allows():
    """The role README allowed ':' once, which the code refuses: each text's characters are the code's, and its
    bounds."""
    accepted, unit_text = _accepted_punctuation()
    assert accepted == set("_.-")
    unit_text.unit_prefix("a" * 200)
    for refused in ("a" * 201, ".", ".."):
        with pytest.raises(Exception):
            unit_text.unit_prefix(refused)
    readme = _readme_rows(os.path.join(ROLE, "README.md"))["name"]
    spec = _role_entry_options()["name"]["description"]
    with open(os.path.join(REPO, "plugins", "filter", "systemd_unit_prefix.yml")) as handle:
        filter_doc = " ".join(yaml.safe_load(handle)["DOCUMENTATION"]["description"])
    texts = {
        "role README": "".join(re.search(r"letters, digits, `([^`]+)`", readme).group(1)),
        "argument spec": re.search(r"letters, digits, C\(([^)]+)\)", spec).group(1),
        "filter doc": "".join(re.findall(r"C\((.)\)", re.search(r"letters, digits, ((?:C\(.\),? ?)+)",
                                                                 filter_doc).group(1))),
    }
    assert {where: set(chars) for where, chars in texts.items()} == {where: accepted for where in texts}
    assert "1 to 200" in readme and "1 to 200" in spec
    assert "not `.` or `..`" in readme and "not C(.) or C(..)" in filter_doc


def test_numa_weights_says_how_the_code_makes_weights():
    """Its doc said "percent share of the total" where the code takes tenths of the fastest node's: the rule's words
    follow decide/weights.STEPS, and every example the doc gives is what the code computes."""
    from ansible_collections.inferops.numa.plugins.module_utils.numa.decide import weights
    description = " ".join(_documentation("numa_weights")["description"])
    assert weights.STEPS == 10 and "bandwidth in tenths of the fastest node's" in description
    assert "percent share of the total bandwidth" not in description
    examples = re.findall(r"(\d+) and (\d+)(?: GB/s)? give (\d+) and (\d+)", description)
    assert len(examples) >= 2
    for fast, slow, first, second in examples:
        assert weights.weights_from_bandwidth({0: float(fast), 1: float(slow)}) == {0: int(first), 1: int(second)}
