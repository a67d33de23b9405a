"""A wrapper unit names the numa-pin version it was deployed with (inference_service's vars/main.yml, through
ansible-playbook): the version numa_host put in place in this run, else the one the path links to, else the path.
So a new helper changes the unit's text, and the unit is restarted through the gated rollout; a unit rolled back
starts its own version."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.tools import REPO, ansible_command
from tests.unit.test_units import TEMPLATES, case, one, split_exec

ROLE_VARS = os.path.join(REPO, "roles", "inference_service", "vars", "main.yml")

PLAYBOOK = """\
- name: Resolve the launcher a wrapper unit names, and render the unit with it
  hosts: localhost
  connection: local
  gather_facts: false
  vars_files: ["{{ role_vars }}"]
  tasks:
    - name: Read the helper path as the role does
      ansible.builtin.stat:
        path: "{{ inference_service_numa_pin }}"
        follow: false
        get_checksum: false
      register: _inference_service_helper

    - name: Keep the launcher and the unit's text
      ansible.builtin.copy:
        content: "{{ {'launcher': _inference_service_numa_pin_launcher,
                      'unit': lookup('ansible.builtin.template', templates ~ '/service@.service.j2')} | to_json }}"
        dest: "{{ out }}"
        mode: "0644"
      vars:
        _inference_service_cfg: "{{ seed.service }}"
        _inference_service_unit: "{{ seed.service.name }}"
        _inference_service_request: "{{ seed.request }}"
        _inference_service_plan: "{{ seed.plan }}"
        _inference_service_systemd_version: "{{ seed.systemd_version }}"
        inference_service_plan_dir: /etc/inferops-numa
"""


def resolve(tmp_path, path, fact=None):
    playbook = tmp_path / "resolve.yml"
    playbook.write_text(PLAYBOOK)
    out = tmp_path / "out.json"
    variables = {"role_vars": ROLE_VARS, "templates": TEMPLATES, "out": str(out), "seed": case("seed-wrapper"),
                 "inference_service_numa_pin": path}
    if fact is not None:
        variables["_numa_host_helper_current"] = fact
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run([ansible_command("ansible-playbook"), "-i", "localhost,", str(playbook),
                           "-e", json.dumps(variables), "-e", "ansible_python_interpreter=%s" % sys.executable],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert split_exec(one(result["unit"], "ExecStart"))[0] == result["launcher"]
    return result["launcher"]


@pytest.fixture
def helper(tmp_path):
    """lib/<version>/numa-pin for two versions, and bin/numa-pin linking to the first."""
    for version in ("aaaaaaaaaaaa", "bbbbbbbbbbbb"):
        (tmp_path / "lib" / version).mkdir(parents=True)
        (tmp_path / "lib" / version / "numa-pin").write_text("#!/bin/sh\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "numa-pin").symlink_to(tmp_path / "lib" / "aaaaaaaaaaaa" / "numa-pin")
    return tmp_path


def test_the_version_numa_host_put_in_place_in_this_run_comes_first(helper, tmp_path):
    """A dry run's too: the path still links to the old version, the unit's diff shows the new one."""
    path = str(helper / "bin" / "numa-pin")
    new = str(helper / "lib" / "bbbbbbbbbbbb" / "numa-pin")
    assert resolve(tmp_path, path, {"path": path, "launcher": new}) == new


def test_without_numa_host_in_the_run_the_unit_names_the_version_the_path_links_to(helper, tmp_path):
    """--tags services: the same text as the run that installed it, so nothing restarts."""
    path = str(helper / "bin" / "numa-pin")
    assert resolve(tmp_path, path) == str(helper / "lib" / "aaaaaaaaaaaa" / "numa-pin")
    other = {"path": "/usr/local/bin/numa-pin", "launcher": "/usr/local/lib/inferops-numa/cccccccccccc/numa-pin"}
    assert resolve(tmp_path, path, other) == str(helper / "lib" / "aaaaaaaaaaaa" / "numa-pin")


def test_a_relative_link_is_resolved(helper, tmp_path):
    relative = helper / "bin" / "relative"
    relative.symlink_to(os.path.join("..", "lib", "bbbbbbbbbbbb", "numa-pin"))
    assert resolve(tmp_path, str(relative)) == str(helper / "lib" / "bbbbbbbbbbbb" / "numa-pin")


def test_a_helper_installed_otherwise_is_named_by_its_path(helper, tmp_path):
    plain = helper / "bin" / "plain"
    plain.write_text("#!/bin/sh\n")
    assert resolve(tmp_path, str(plain)) == str(plain)
    assert resolve(tmp_path, str(helper / "bin" / "absent")) == str(helper / "bin" / "absent")


def test_the_role_vars_file_holds_the_choice():
    with open(ROLE_VARS) as handle:
        assert "_inference_service_numa_pin_launcher" in yaml.safe_load(handle)
