"""A bad numa-pin stopped at the canary host: site.yml's default batches in the lab guest.

The guest is two inventory hosts here, canary-a and canary-b (the same machine, each with a helper directory, a
numa-pin path and a stand-in service of its own; the metrics tasks skipped, so the guest's own timer stays as
converge left it). site.yml deploys both with the collection's helper; then again with a broken copy of the package
(numa_host_helper_source), whose `numa-pin facts` works, so the install's own check passes, but whose `exec` exits 3,
so a server cannot start through it. With the defaults (one canary host first, the first failed host stops the run):

- canary-a, the canary, installs the broken version beside the good one and its unit moves to it; the restart
  fails, the rollout puts the unit back on its previous text, which names the good version (still installed), and
  the service runs again; the host fails;
- the run stops there and its last line says so: canary-b is left untouched, its path, its versions, its unit and
  its running service as they were.

Everything is removed afterwards, so the guest is as converge left it for the other checks.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import CONVERGE_S, PROJECT, VM_NAME, budget, labvm, unit_state

pytestmark = pytest.mark.usefixtures("two_nodes")

RUN_VARS = os.path.join(PROJECT, "build", "reports", "lab-run-vars.json")
HOSTS = {
    "canary-a": {"port": 8120},
    "canary-b": {"port": 8121},
}
STOP_LINE = "inferops.numa: stopped after canary-a failed (max_fail_percentage 0): left untouched: canary-b"
BROKEN = '''

def run_exec(args, server_argv):  # noqa: F811 (broken on purpose by molecule/default/tests/test_canary.py)
    sys.stderr.write("numa-pin: broken on purpose by the lab's canary test\\n")
    return 3
'''


def helper_dir(name):
    return "/usr/local/lib/inferops-%s" % name


def helper_path(name):
    return "/usr/local/bin/numa-pin-%s" % name


def service(name):
    return "lab-%s" % name


def unit(name):
    return "%s@0.service" % service(name)


def unit_file(name):
    return "/etc/systemd/system/%s@.service" % service(name)


def inventory(tmp_path):
    """The guest twice, each host with its own helper and its own stand-in service (tests/lab/weights_server.py)."""
    guest = labvm.instance(VM_NAME)
    connection = {"ansible_host": guest["address"], "ansible_port": guest["port"], "ansible_user": guest["user"],
                  "ansible_ssh_private_key_file": str(guest["identity_file"]),
                  "ansible_python_interpreter": "/usr/bin/python3"}
    hosts = {}
    for name, settings in HOSTS.items():
        hosts[name] = dict(connection, numa_host_helper_dir=helper_dir(name), numa_host_helper_path=helper_path(name),
                           inference_service_numa_pin=helper_path(name), inference_service_list=[{
                               "name": service(name), "layout": "single", "gpus": "none",
                               "command": ["/usr/bin/python3", "/usr/local/lib/inferops-lab/weights_server.py",
                                           "--port", "{port}", "--weights-mb", "32"],
                               # A node of its own choosing: an automatic choice follows free memory, which the
                               # guest's other services move between the deployment's plan and numa-pin's at start.
                               "node": 1,
                               "port_base": settings["port"], "model_size": "32M", "memory_headroom": "16M",
                               "type": "notify", "pages": "anon", "user": "llama",
                               # A start that fails is failed at once, not restarted until the gate's time is up.
                               "restart": "no"}])
    path = tmp_path / "canary-inventory.json"
    path.write_text(json.dumps({"all": {"hosts": hosts}}))
    return path


def site(tmp_path, *extra):
    """site.yml over both hosts with the defaults (canary first, stop at the first failure); (rc, output)."""
    with open(RUN_VARS) as handle:
        run_vars = json.load(handle)
    variables = tmp_path / "canary-vars.json"
    variables.write_text(json.dumps({"inference_service_audit_wait_seconds":
                                     run_vars["inference_service_audit_wait_seconds"]}))
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_HOST_KEY_CHECKING="False",
               ANSIBLE_CALLBACKS_ENABLED="inferops.numa.untouched_hosts")
    done = subprocess.run([playbook, "-i", str(inventory(tmp_path)), os.path.join(PROJECT, "site.yml"),
                           "-e", "@%s" % variables, "--skip-tags", "metrics"] + list(extra),
                          cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=budget(CONVERGE_S) * 2)
    return done.returncode, done.stdout


def broken_package(tmp_path):
    """A copy of the collection's package whose `exec` fails: facts, explain and metrics work as they do."""
    copy = tmp_path / "broken" / "numa"
    shutil.copytree(os.path.join(PROJECT, "plugins", "module_utils", "numa"), str(copy),
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(str(copy / "cli" / "numa_pin.py"), "a") as handle:
        handle.write(BROKEN)
    return str(copy)


def versions(host, name):
    listed = host.run("ls -1 %s" % helper_dir(name))
    assert listed.rc == 0, listed.stderr
    return sorted(version for version in listed.stdout.split() if re.match(r"^[0-9a-f]{12}$", version))


def linked_version(host, name):
    target = host.run("readlink %s" % helper_path(name)).stdout.strip()
    assert target.startswith(helper_dir(name) + "/") and target.endswith("/numa-pin"), target
    return target.split("/")[-2]


def started_version(host, name):
    """The helper version the unit file's ExecStart= names."""
    text = host.file(unit_file(name)).content_string
    (line,) = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    found = re.match(r"^ExecStart=%s/([0-9a-f]{12})/numa-pin exec " % re.escape(helper_dir(name)), line)
    assert found, line
    return found.group(1)


def invocation(host, name):
    return host.service(unit(name)).systemd_properties["InvocationID"]


@pytest.fixture
def canary_hosts(host):
    yield
    names = list(HOSTS)
    script = "; ".join([
        "systemctl disable --now %s" % " ".join(unit(name) for name in names),
        "systemctl reset-failed %s" % " ".join(unit(name) for name in names),
        "rm -rf %s" % " ".join(
            path for name in names for path in (
                unit_file(name), unit_file(name) + ".previous", unit_file(name) + ".rejected",
                "/etc/systemd/system/%s@0.service.d" % service(name), "/etc/inferops-numa/%s@*" % service(name),
                "/etc/inferops-numa/%s.*" % service(name), "/var/lib/%s" % service(name),
                helper_dir(name), helper_path(name))),
        "systemctl daemon-reload"])
    host.run(script)


def test_a_bad_helper_is_stopped_at_the_canary_host(host, tmp_path, canary_hosts):
    code, output = site(tmp_path)
    assert code == 0, output[-6000:]
    good = {name: linked_version(host, name) for name in HOSTS}
    assert len(set(good.values())) == 1, good  # the same package and interpreter: the same version on both
    for name in HOSTS:
        assert versions(host, name) == [good[name]] and started_version(host, name) == good[name]
        assert unit_state(host, unit(name)) == "active"
    before = {name: invocation(host, name) for name in HOSTS}

    code, output = site(tmp_path, "-e", "numa_host_helper_source=%s" % broken_package(tmp_path))
    assert code != 0, output[-6000:]
    assert STOP_LINE in output.splitlines(), output[-6000:]
    assert re.search(r"^canary-b\s+: ok=1 ", output, re.MULTILINE), output[-3000:]  # the preflight, nothing more

    # The canary: the broken version beside the good one, its unit back on the good one, serving again.
    (bad,) = set(versions(host, "canary-a")) - {good["canary-a"]}
    assert linked_version(host, "canary-a") == bad  # the path follows the newest install; the units are gated
    assert started_version(host, "canary-a") == good["canary-a"]
    assert unit_state(host, unit("canary-a")) == "active"
    assert "broken on purpose" in host.run("journalctl -q -o cat -u %s" % unit("canary-a")).stdout

    # The other host: untouched.
    assert versions(host, "canary-b") == [good["canary-b"]]
    assert linked_version(host, "canary-b") == good["canary-b"]
    assert started_version(host, "canary-b") == good["canary-b"]
    assert invocation(host, "canary-b") == before["canary-b"] and unit_state(host, unit("canary-b")) == "active"
