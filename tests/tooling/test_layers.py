"""Dependencies point inward, seen by Ansible and by the interpreter: the layer table itself
(tests/unit/test_dependency_table.py) holds the package's own imports; here, the plugins never import
numa-pin's edge (cli/), the payload Ansible's own dependency finder builds for numa_plan is only what it
uses, and ``numa-pin exec`` imports only what a service's start needs.
"""

import ast
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(REPO, "plugins", "module_utils", "numa")
PACKAGE_NAME = "ansible_collections.inferops.numa.plugins.module_utils.numa"
PLUGINS = [os.path.join(kind, name) for kind in ("modules", "filter", "action", "plugin_utils")
           for name in sorted(os.listdir(os.path.join(REPO, "plugins", kind))) if name.endswith(".py")]


def imported_package_modules(path):
    """"layer/module" of every module of the numa package the plugin at path imports, anywhere in it."""
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE_NAME + "."):
            layer, _, module = node.module[len(PACKAGE_NAME) + 1:].partition(".")
            found.update(["%s/%s" % (layer, module)] if module else
                         ["%s/%s" % (layer, alias.name) for alias in node.names])
        elif isinstance(node, ast.Import):
            found.update(alias.name[len(PACKAGE_NAME) + 1:].replace(".", "/") for alias in node.names
                         if alias.name.startswith(PACKAGE_NAME + "."))
    return found


def test_the_import_reader_sees_both_spellings():
    assert imported_package_modules(os.path.join(REPO, "plugins", "modules", "numa_plan.py")) == {
        "base/errors", "decide/placement", "inputs/request", "read/topology", "act/unit_text", "base/containers"}
    assert "watch/metrics" in imported_package_modules(os.path.join(REPO, "plugins", "plugin_utils", "fleet_report.py"))


@pytest.mark.parametrize("plugin", PLUGINS)
def test_ansible_plugins_never_import_the_cli(plugin):
    used = imported_package_modules(os.path.join(REPO, "plugins", plugin))
    assert {module for module in used if module.startswith("cli/")} == set()


# Run apart: the collection finder Ansible installs replaces the import system of the process.
PAYLOAD_SCRIPT = """
import datetime, io, sys, zipfile
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
_AnsibleCollectionFinder(paths=[sys.argv[1]])._install()
from ansible.executor.module_common import recursive_finder
try:
    from ansible._internal._ansiballz._builder import ExtensionManager
    since_2_19 = (datetime.datetime(2020, 1, 1), ExtensionManager())
except ImportError:  # ansible-core < 2.19: name, fqn, source and the zip only
    since_2_19 = ()

with open(sys.argv[2], "rb") as handle:
    source = handle.read()
with zipfile.ZipFile(io.BytesIO(), "w") as payload:
    recursive_finder("numa_plan", "ansible_collections.inferops.numa.plugins.modules.numa_plan", source, payload,
                     *since_2_19)
    print("\\n".join(payload.namelist()))
"""


def test_numa_plan_ships_only_what_it_uses():
    """Ansible's own dependency finder (the one that builds the AnsiballZ payload) on numa_plan."""
    done = subprocess.run([sys.executable, "-c", PAYLOAD_SCRIPT, os.path.join(REPO, "build"),
                           os.path.join(REPO, "plugins", "modules", "numa_plan.py")],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=False)
    assert done.returncode == 0, done.stderr
    prefix = "ansible_collections/inferops/numa/plugins/module_utils/numa/"
    shipped = {name[len(prefix):-3] for name in done.stdout.split() if name.startswith(prefix)}
    # system/kernel: the reader's openat2 under a root (numa_plan's root option); system/trusted_files and safe_fs:
    # the plan record read as every reader of it reads it (is it current?)
    layers = {"%s/__init__" % layer for layer in ("act", "base", "decide", "inputs", "read", "system")}
    # base/containers: the container option's choices (the runtime is recorded for the audit).
    assert shipped == layers | {"__init__", "act/unit_text", "base/containers", "base/cpulist", "base/engines",
                                "base/errors", "base/gpu_vendors", "base/sizes", "base/tokens", "decide/placement",
                                "inputs/request", "read/kernel_files", "read/topology", "system/kernel",
                                "system/root_files", "system/safe_fs", "system/trusted_files"}


def test_numa_pin_exec_imports_neither_the_cost_engine_nor_the_audit():
    """What a service start imports, seen by the interpreter itself (-X importtime): exec stops at the
    missing server, after the plan, the placement and the page-cache look."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "numa", "exec", "--node", "0", "--best-effort",
                           "--model", __file__, "--", "/nonexistent/server"],
                          env=dict(os.environ, PYTHONPATH=os.path.dirname(PACKAGE)), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=60, check=False)
    assert "cannot exec '/nonexistent/server'" in done.stderr, done.stderr
    imported = set(re.findall(r"\|\s+numa\.([\w.]+)\s*$", done.stderr, re.MULTILINE))
    assert {"cli.numa_pin", "inputs.request", "decide.placement", "system.kernel"} <= imported
    assert imported & {"measure.cost", "cli.cost_command", "read.audit", "read.numastat", "act.unit_text",
                       "act.balancing", "watch"} == set()
