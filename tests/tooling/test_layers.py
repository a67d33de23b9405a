"""Dependencies point inward: the numa-pin CLI uses the core modules, never the other way round.

The core (topology, placement, kernel, audit, cost, systemd, request, ...) is what
Ansible modules and filters run; cli.py and cli_cost.py are numa-pin's edge. A core
module importing the CLI would ship it, and all it imports, in every module's
payload, and run it inside modules. Checked three ways: the import statements
(ast), the payload Ansible's own dependency finder builds for numa_plan, and the
modules ``numa-pin exec`` really imports at a service's start.
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
CLI_SIDE = {"cli", "cli_cost", "__main__"}
CORE = sorted(name[:-3] for name in os.listdir(PACKAGE) if name.endswith(".py") and name[:-3] not in CLI_SIDE)
PLUGINS = [os.path.join(kind, name) for kind in ("modules", "filter")
           for name in sorted(os.listdir(os.path.join(REPO, "plugins", kind))) if name.endswith(".py")]


def imported_package_modules(path, in_package):
    """Modules of the numa package that the file at path imports, anywhere in it (lazy imports too)."""
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level == 1 and in_package:
                names = [base] if base else [alias.name for alias in node.names]
            elif base == PACKAGE_NAME:
                names = [alias.name for alias in node.names]
            elif base.startswith(PACKAGE_NAME + "."):
                names = [base[len(PACKAGE_NAME) + 1:]]
            else:
                names = []
            found.update(name.split(".")[0] for name in names)
        elif isinstance(node, ast.Import):
            found.update(alias.name[len(PACKAGE_NAME) + 1:].split(".")[0] for alias in node.names
                         if alias.name.startswith(PACKAGE_NAME + "."))
    return found


def test_the_import_reader_sees_relative_absolute_and_lazy_imports():
    assert {"errors", "request", "tokens", "placement", "audit", "cli_cost"} <= imported_package_modules(
        os.path.join(PACKAGE, "cli.py"), in_package=True)
    assert imported_package_modules(os.path.join(REPO, "plugins", "modules", "numa_plan.py"), in_package=False) == {
        "errors", "placement", "request", "topology", "unit_text"}


@pytest.mark.parametrize("module", CORE)
def test_core_modules_never_import_the_cli(module):
    assert imported_package_modules(os.path.join(PACKAGE, module + ".py"), in_package=True) & CLI_SIDE == set()


@pytest.mark.parametrize("plugin", PLUGINS)
def test_ansible_plugins_never_import_the_cli(plugin):
    used = imported_package_modules(os.path.join(REPO, "plugins", plugin), in_package=False)
    assert used & CLI_SIDE == set()


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
    # kernel: the reader's openat2 under a root (numa_plan's root option)
    assert shipped == {"__init__", "cpulist", "engines", "errors", "gpu_vendors", "kernel", "kernel_files", "placement",
                       "request", "sizes", "topology", "unit_text"}


def test_numa_pin_exec_imports_neither_the_cost_engine_nor_the_audit():
    """What a service start imports, seen by the interpreter itself (-X importtime): exec stops at the
    missing server, after the plan, the placement and the page-cache look."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "numa", "exec", "--node", "0", "--best-effort",
                           "--model", __file__, "--", "/nonexistent/server"],
                          env=dict(os.environ, PYTHONPATH=os.path.dirname(PACKAGE)), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=60, check=False)
    assert "cannot exec '/nonexistent/server'" in done.stderr, done.stderr
    imported = set(re.findall(r"\|\s+numa\.(\w+)\s*$", done.stderr, re.MULTILINE))
    assert {"cli", "request", "placement", "kernel"} <= imported
    assert imported & {"cost", "cli_cost", "audit", "numastat", "unit_text", "balancing"} == set()
