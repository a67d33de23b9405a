"""docs/capture.md's command captures what the facts read: run on this machine, the capture holds every file the
topology reader opens here, and the facts of the capture are this machine's (but for the memory that moved
between the two reads).
"""

import os
import re
import subprocess
import sys

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.read import kernel_files, topology

from tests.tools import ansible_command

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_LINE = "out=/tmp/$(hostname)-numa"
# Free and available memory, and the page cache, change between two reads of a live machine.
VOLATILE = re.compile(r"free|available|file_kb|cached|shmem", re.IGNORECASE)


def _script():
    with open(os.path.join(REPO, "docs", "capture.md")) as handle:
        (block,) = re.findall(r"^```sh\n(.*?)^```", handle.read(), re.MULTILINE | re.DOTALL)
    assert block.startswith(OUT_LINE + "\n"), "the test puts the capture in its own directory by this line"
    return block


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    if not os.path.isdir("/sys/devices/system/cpu") or not os.path.isfile("/proc/meminfo"):
        pytest.skip("no sysfs and procfs here")
    out = tmp_path_factory.mktemp("capture") / "machine"
    script = _script().replace(OUT_LINE, "out=%s" % out, 1)
    # As a reader pastes it: bash without -e (cp's refusals of write-only sysfs files are expected).
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert os.path.isfile("%s.tar.gz" % out), done.stdout + done.stderr
    return str(out)


def _opened(monkeypatch):
    """Record every path under the root the reader read, listed or found (only those that this host has)."""
    seen = set()
    for name in ("read_with_mode", "listdir"):
        original = getattr(kernel_files.Root, name)

        def recording(self, rel, *args, _original=original, **kwargs):
            result = _original(self, rel, *args, **kwargs)
            seen.add(rel)
            return result
        monkeypatch.setattr(kernel_files.Root, name, recording)
    original_exists = kernel_files.Root.exists

    def exists(self, rel):
        found = original_exists(self, rel)
        if found:
            seen.add(rel)
        return found
    monkeypatch.setattr(kernel_files.Root, "exists", exists)
    return seen


def _stable(value):
    if isinstance(value, dict):
        return {key: _stable(item) for key, item in value.items() if not VOLATILE.search(key) and key != "root"}
    if isinstance(value, list):
        return [_stable(item) for item in value]
    return value


def test_the_capture_holds_every_file_the_facts_read_here(captured, monkeypatch):
    seen = _opened(monkeypatch)
    topology.read("/")
    assert "sys/devices/system/cpu/online" in seen and "proc/meminfo" in seen  # the recording sees the reads
    left_out = sorted(rel for rel in seen if not os.path.lexists(os.path.join(captured, rel)))
    assert left_out == [], "docs/capture.md's command leaves out files the reader opens"


def test_the_facts_of_the_capture_are_this_machines(captured):
    here, there = topology.read("/"), topology.read(captured)
    assert there["cpus"]["online"] and there["nodes"]
    assert _stable(there) == _stable(here)


def test_the_commands_that_use_a_capture_work_as_written(captured, tmp_path):
    """The "Using it" block, run in a directory that holds the capture's tarball under the name it uses."""
    with open(os.path.join(REPO, "docs", "capture.md")) as handle:
        (block,) = re.findall(r"^```console\n(.*?)^```", handle.read(), re.MULTILINE | re.DOTALL)
    os.symlink("%s.tar.gz" % captured, str(tmp_path / "llm-07-numa.tar.gz"))
    shim = tmp_path / "bin" / "numa-pin"  # numa-pin as numa_host installs it: the checkout's package
    shim.parent.mkdir()
    shim.write_text('#!/bin/sh\nPYTHONPATH=%s exec %s -m numa "$@"\n'
                    % (os.path.join(REPO, "plugins", "module_utils"), sys.executable))
    shim.chmod(0o755)
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PATH=os.pathsep.join([str(shim.parent), os.path.dirname(ansible_command("ansible")), env["PATH"]]))
    lines = [re.sub(r"\s{2,}#.*$", "", line) for line in block.splitlines() if line.strip()]
    assert [line for line in lines if line.startswith("numa-pin explain --root llm-07")]
    for line in lines:
        done = subprocess.run(["bash", "-c", line], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, "%s:\n%s%s" % (line, done.stdout[-2000:], done.stderr[-2000:])
        if line.startswith("ansible "):
            assert "SUCCESS" in done.stdout, line
