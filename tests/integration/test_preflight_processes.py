"""The preflight through ansible-playbook: site.yml stops on every host before any change, one line per problem;
the roles get their variables converted once; a second preflight of the run with the same inputs skips the host."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import yaml

from tests.tools import REPO, ansible_command, needs
from tests.unit.test_preflight import SERVICE, _host

SETPRIV = shutil.which("setpriv")
CAP_SYS_PTRACE = 19
# What lets root read another user's /proc/<pid>/numa_maps: CAP_SYS_PTRACE everywhere; on some newer kernels
# CAP_SYS_ADMIN or CAP_PERFMON as well. Without all three, the kernel refuses on every kernel.
NO_PAGE_READING = "-sys_ptrace,-sys_admin,-perfmon"


def playbook(tmp_path, path, hostvars, *extra, prefix=()):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"box": dict(
        hostvars, ansible_connection="local", ansible_python_interpreter=os.sys.executable)}}}))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    done = subprocess.run(list(prefix) + [ansible_command("ansible-playbook"), "-i", str(inventory), path]
                          + list(extra), cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
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


def test_site_stops_in_the_preflight_on_what_would_fail_after_the_change(tmp_path):
    """Each of these passed the preflight before and failed later, after hosts were changed: a name no unit can
    carry (at the unit filter), a typo'd gate key (at numa_rollout), a NaN threshold (at the audit, after the
    restart), a URL the probe cannot ask, {port} without a port, and a typo'd variable (nothing deployed, all ok)."""
    services = [dict(SERVICE, port_base=8000, ab_gate={"rouns": 3}),
                dict(SERVICE, name="../etc"),
                dict(SERVICE, name="vllm", command=["/opt/vllm/bin/vllm", "--port", "{port}"],
                     health_url="htp://127.0.0.1:{port}/health", min_local_percent=float("nan"))]
    code, output = playbook(tmp_path, "site.yml", {"inference_service_list": services,
                                                   "inference_services_list": [SERVICE]})
    assert code != 0, output
    for line in ("preflight: box: inference_services_list: no such variable; did you mean inference_service_list?",
                 "preflight: box: service llama: ab_gate: rouns: no such key; did you mean rounds?",
                 "preflight: box: inference_service_list[1]: name: service name '../etc' cannot name a systemd "
                 "template unit",
                 "preflight: box: service vllm: health_url: 'htp://127.0.0.1:{port}/health' is not an http or https "
                 "URL with a host; give one like http://127.0.0.1:{port}/health",
                 "preflight: box: service vllm: min_local_percent: nan is not a finite number; give a value from 0 "
                 "to 100",
                 "preflight: box: service vllm: command: argument '{port}' uses {port} but the plan has no port: "
                 "set port_base on the service"):
        assert line in output, output
    assert "PLAY [Prepare NUMA hosts]" not in output and "PLAY [Deploy NUMA-pinned" not in output, output
    assert "Traceback" not in output, output


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


def _nobody_sleeping():
    def become_nobody():
        os.setgroups([])
        os.setresgid(65534, 65534, 65534)
        os.setresuid(65534, 65534, 65534)

    child = subprocess.Popen(["sleep", "60"], preexec_fn=become_nobody)  # noqa: PLW1509 - a test's own child
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until it runs sleep as nobody, not this interpreter's fork
        with open("/proc/%d/status" % child.pid) as handle:
            status = handle.read()
        if "\nUid:\t65534" in status and "Name:\tsleep" in status:
            return child
        time.sleep(0.01)
    child.kill()
    raise AssertionError("the child never ran sleep as nobody")


def _has_capability(bit):
    with open("/proc/self/status") as handle:
        caps = dict(line.split(":", 1) for line in handle if line.startswith("Cap"))
    return bool(int(caps["CapEff"], 16) >> bit & 1)


ROOT_WITH_PTRACE = pytest.mark.skipif(os.geteuid() != 0 or not _has_capability(CAP_SYS_PTRACE),
                                      reason="needs root with CAP_SYS_PTRACE, to drop it")


@ROOT_WITH_PTRACE
@needs(not SETPRIV, "setpriv (util-linux) is not installed: it drops the capability from the run")
def test_the_preflight_names_a_missing_cap_sys_ptrace_on_the_live_host(tmp_path):
    """ansible-playbook run without CAP_SYS_PTRACE (as a container's default capabilities leave it): the module's
    own process reads its CapEff on the live host and names the service's user; with it, no such line."""
    plays = tmp_path / "play.yml"
    plays.write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": [
        {"inferops.numa.numa_preflight": {"root": "/"}}]}]))
    hostvars = {"inference_service_list": [{"name": "llama", "command": ["/bin/sleep", "60"], "user": "nobody"}],
                "numa_host_balancing": "keep"}
    line = ("preflight: box: service llama: audit: root here lacks CAP_SYS_PTRACE, so it cannot read "
            "/proc/<pid>/numa_maps of the service's user nobody (a container's default capabilities); grant "
            "CAP_SYS_PTRACE to the run, or set audit: false")
    code, output = playbook(tmp_path, str(plays), hostvars, prefix=(SETPRIV, "--bounding-set=-sys_ptrace"))
    assert code != 0 and line in output, output
    code, output = playbook(tmp_path, str(plays), hostvars)
    # The host's checks ran (passed, or failed with their lines: a host without systemd), and named no capability.
    assert code == 0 or "preflight: box: " in output, output
    assert "CAP_SYS_PTRACE" not in output and "Traceback" not in output, output


@ROOT_WITH_PTRACE
@needs(not SETPRIV, "setpriv (util-linux) is not installed: it drops the capability from the run")
def test_the_audit_refused_as_root_names_the_capability_not_root():
    """A real refusal: root without the capabilities that read another user's pages audits a process of nobody."""
    child = _nobody_sleeping()
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError\n"
            "from ansible_collections.inferops.numa.plugins.module_utils.numa.read import audit\n"
            "try:\n    audit.read_process('/', %d, 4096)\nexcept NumaError as exc:\n    print(exc)\n"
            "else:\n    print('read')\n" % (os.path.join(REPO, "build"), child.pid))
    try:
        done = subprocess.run([SETPRIV, "--bounding-set=" + NO_PAGE_READING, sys.executable, "-c", code],
                              capture_output=True, text=True, timeout=60, check=False)
    finally:
        child.kill()
        child.wait()
    assert done.returncode == 0 and done.stderr == "", done.stderr
    if done.stdout.strip() == "read":
        pytest.skip("this kernel lets root read another user's pages without those capabilities")
    assert done.stdout.startswith("cannot read /proc/%d/numa_maps: permission denied to root, which lacks "
                                  "CAP_SYS_PTRACE here" % child.pid), done.stdout
    assert "run as root" not in done.stdout
