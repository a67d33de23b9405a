"""numad as numa_host found it: the role stops a running, enabled numad and records that once; numa_host_state
absent starts and enables it again and deletes the record; a second absent run changes nothing. Under the fake
systemd (tests/helpers/fake_systemd), every path of the role in a directory of the test."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.fake_systemd import fake_systemd_fixture
from tests.tools import ansible_command
from tests.unit.test_balancing_module import REPO

PLAY = """\
- name: numad as numa_host handles it
  hosts: localhost
  connection: local
  gather_facts: false
  module_defaults:
    group/inferops.numa.numa:
      root: {root}
  tasks:
    - name: Run one of the role's task files
      ansible.builtin.include_role:
        name: inferops.numa.numa_host
        tasks_from: "{{{{ role_tasks }}}}"
"""


@pytest.fixture
def fake(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: the role writes root-owned records")
    yield from fake_systemd_fixture(tmp_path)


def run(fake, tmp_path, tasks):
    base = tmp_path / "host"
    variables = {"role_tasks": tasks, "_numa_host_originals_dir": str(base / "originals"),
                 "numa_host_helper_dir": str(base / "lib"), "numa_host_helper_path": str(base / "bin" / "numa-pin"),
                 "numa_host_metrics_dir": str(base / "metrics"), "_numa_host_helper_unit_dirs": [str(base / "units")],
                 "ansible_python_interpreter": sys.executable}
    os.makedirs(str(base / "knobs"), exist_ok=True)
    play = tmp_path / "numad.yml"
    play.write_text(PLAY.format(root=base / "knobs"))
    env = fake.env()
    env.update(ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run([ansible_command("ansible-playbook"), "-i", "localhost,", str(play), "-e",
                           json.dumps(variables)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("localhost ") and "changed=" in line]
    return int(line.split("changed=")[1].split()[0]), base / "originals" / "numad.json"


def test_absent_puts_numad_back_as_the_role_found_it(fake, tmp_path):
    fake.write_unit("numad.service", "[Service]\nExecStart=/bin/sleep 600\n\n[Install]\nWantedBy=multi-user.target\n")
    fake.systemctl("enable", "--now", "numad.service", check=True)
    changed, record = run(fake, tmp_path, "numad")
    assert changed and fake.show("numad.service", "ActiveState", "UnitFileState") == {
        "ActiveState": "inactive", "UnitFileState": "disabled"}
    assert json.loads(record.read_text()) == {"active": True, "enabled": True}
    assert oct(os.stat(str(record)).st_mode & 0o777) == "0o600"
    assert run(fake, tmp_path, "numad")[0] == 0  # stopped by us now: the record keeps what was found first

    changed, record = run(fake, tmp_path, "absent")
    assert changed and not record.exists()
    assert fake.show("numad.service", "ActiveState", "UnitFileState") == {
        "ActiveState": "active", "UnitFileState": "enabled"}
    assert run(fake, tmp_path, "absent")[0] == 0
