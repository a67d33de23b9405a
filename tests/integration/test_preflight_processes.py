"""The preflight through ansible-playbook: site.yml stops on every host before any change, one line per problem;
the roles get their variables converted once; a second preflight of the run with the same inputs skips the host."""

import json
import os
import subprocess

import yaml

from tests.tools import REPO, ansible_command
from tests.unit.test_preflight import SERVICE, _host


def playbook(tmp_path, path, hostvars, *extra):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"box": dict(
        hostvars, ansible_connection="local", ansible_python_interpreter=os.sys.executable)}}}))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    done = subprocess.run([ansible_command("ansible-playbook"), "-i", str(inventory), path] + list(extra),
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    return done.returncode, done.stdout + done.stderr


def test_site_stops_before_any_change_and_names_every_problem(tmp_path):
    bad = dict(SERVICE, layout="per-node", page_cahce="evict")
    code, output = playbook(tmp_path, "site.yml", {"inference_service_list": [bad], "numa_host_metricz": True},
                            "-e", "numa_host_metrics_period_seconds=5")
    assert code != 0, output
    for line in ("preflight: box: numa_host_metrics_period_seconds: 5 is out of range; give a value from 10 to 86400",
                 "preflight: box: numa_host_metricz: no such key; did you mean numa_host_metrics?",
                 "preflight: box: service llama: layout: 'per-node' is not one of its choices",
                 "preflight: box: service llama: page_cahce: no such key; did you mean page_cache?"):
        assert line in output, output
    # any_errors_fatal: the plays that change hosts never start, and the spec is not dumped after the lines.
    assert "PLAY [Prepare each NUMA host" not in output and "argument_spec_data" not in output, output


def test_the_settings_come_back_typed_and_a_second_preflight_skips_the_host(tmp_path):
    root = _host(tmp_path / "host", slice_cpus=("0-159", "0-1"))
    plays = tmp_path / "play.yml"
    out = tmp_path / "out.json"
    plays.write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": [
        {"inferops.numa.numa_preflight": {"root": root}, "register": "numa_preflight"},
        {"ansible.builtin.copy": {"content": "{{ numa_preflight | to_json }}", "dest": str(out), "mode": "0644"}},
        {"inferops.numa.numa_preflight": {"root": root}, "register": "numa_preflight"},
        {"ansible.builtin.copy": {"content": "{{ numa_preflight | to_json }}", "dest": str(out) + ".2",
                                  "mode": "0644"}}]}]))
    code, output = playbook(tmp_path, str(plays), {"inference_service_list": [SERVICE]},
                            "-e", "numa_host_metrics=false", "-e", "numa_host_balancing=keep")
    assert code == 0, output
    first, second = json.loads(out.read_text()), json.loads((tmp_path / "out.json.2").read_text())
    assert first["settings"]["numa_host_metrics"] is False and first["host_checked"] is True
    assert first["entries"][0]["layout"] == "per_node" and first["entries"][0]["pin_mode"] == "wrapper"
    assert second["host_checked"] is False and second["settings"] == first["settings"]


def test_a_host_problem_fails_the_preflight_with_its_line(tmp_path):
    root = _host(tmp_path / "host", server=False)
    plays = tmp_path / "play.yml"
    plays.write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": [
        {"inferops.numa.numa_preflight": {"root": root}}]}]))
    code, output = playbook(tmp_path, str(plays), {"inference_service_list": [SERVICE]})
    line = "preflight: box: service llama: command: /opt/llama/llama-server is not an executable file here"
    assert code != 0 and line in output, output
