"""numa-pin's start path in an interpreter of its own: what it imports."""

import re
import subprocess
import sys

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.cli import numa_pin

from tests.unit.test_cli_start import HEAVY, PACKAGE_PARENT


@pytest.mark.parametrize("args", [
    ["exec", "--node", "0", "--best-effort", "--model", __file__, "--", "/nonexistent/server"],
    ["exec", "--instances", "2", "--instance", "1", "--memory-headroom", "10%+1G", "--model-size", "1M",
     "--best-effort", "--", "/nonexistent/server"],
    ["facts"],
])
def test_a_start_imports_none_of_the_heavy_standard_modules(args):
    """As the installed launcher runs it (-I -S, the package on sys.path): what the interpreter imports."""
    launcher = "import sys; sys.path.insert(0, %r); from numa.cli.numa_pin import run; run()" % PACKAGE_PARENT
    done = subprocess.run([sys.executable, "-I", "-S", "-X", "importtime", "-c", launcher] + args,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60,
                          check=False)
    assert done.returncode in (0, numa_pin.EXIT_NOT_FOUND), done.stderr
    imported = set(re.findall(r"\|\s+([\w.]+)\s*$", done.stderr, re.MULTILINE))
    assert "numa.cli.numa_pin" in imported
    assert imported & HEAVY == set()
