"""Module documentation written once: the root option every host module takes, and the attributes of the
modules that only read, come from plugins/doc_fragments/host_root.py, not from a copy in each module."""

import ast
import os

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULES = os.path.join(REPO, "plugins", "modules")
NAMES = sorted(name[:-3] for name in os.listdir(MODULES) if name.endswith(".py"))


def _documentation(name):
    with open(os.path.join(MODULES, name + ".py")) as handle:
        tree = ast.parse(handle.read())
    (text,) = [node.value.value for node in tree.body if isinstance(node, ast.Assign)
               and [target.id for target in node.targets if isinstance(target, ast.Name)] == ["DOCUMENTATION"]]
    return yaml.safe_load(text)


def _takes_root(name):
    """Whether the module's argument spec has a root option (as a dict key or a dict() keyword)."""
    with open(os.path.join(MODULES, name + ".py")) as handle:
        source = handle.read()
    return '"root": {"type": "path", "default": "/"}' in source or 'root={"type": "path", "default": "/"}' in source


@pytest.mark.parametrize("name", NAMES)
def test_a_module_taking_root_documents_it_with_the_fragment_only(name):
    doc = _documentation(name)
    fragments = doc.get("extends_documentation_fragment") or []
    assert "root" not in (doc.get("options") or {}), name
    assert ("inferops.numa.host_root" in fragments) == _takes_root(name), name


@pytest.mark.parametrize("name", NAMES)
def test_no_module_restates_the_read_only_attributes(name):
    attributes = _documentation(name).get("attributes") or {}
    read_only = ({"support": "full"}, {"support": "none"}, ["linux"])
    spelled = (attributes.get("check_mode"), attributes.get("diff_mode"),
               (attributes.get("platform") or {}).get("platforms"))
    assert spelled != read_only, name
