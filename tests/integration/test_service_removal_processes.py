"""Taking a service back, end to end: the inference_service role run by ansible-playbook against the fake systemd
and the stand-in engine. A service deployed and then given ``state: absent`` leaves no file of ours (the unit and
plan directories and the state directory as they were before the first run), and a second run changes nothing; a
failed first deployment leaves nothing either; a service dropped from the inventory is warned about, one line, and
``inference_service_remove`` takes it back."""

import os
import subprocess
import sys

import pytest
import yaml

from tests.integration.test_rollout_role_processes import Box, _recap, box  # noqa: F401  # box is a fixture
from tests.tools import REPO, ansible_command, warnings_in

PLAY = """\
- name: Deploy or take back the stand-in engine with the inference_service role
  hosts: all
  gather_facts: false
  module_defaults:
    inferops.numa.numa_preflight:
      root: "{{ captured_root }}"
    inferops.numa.numa_service_remove:
      root: "{{ fake_root }}"
  tasks:
    - name: Deploy
      ansible.builtin.include_role:
        name: inferops.numa.inference_service
"""


def play(box, services, *extra, **variables):
    """ansible-playbook of PLAY with ``services`` as the host's inference_service_list: (exit code, output)."""
    inventory = box.tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"box": dict({
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "captured_root": box.captured, "fake_root": box.fake.root, "inference_service_list": services,
        "inference_service_unit_dir": box.fake.unit_dir, "inference_service_plan_dir": box.plans,
        "inference_service_ready_seconds": 10, "inference_service_audit_settle_seconds": 1,
        "inference_service_audit_wait_seconds": 20}, **variables)}}}))
    path = box.tmp_path / "remove.yml"
    path.write_text(PLAY)
    env = box.fake.env()
    env.update(ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run([ansible_command("ansible-playbook"), "-v", "-i", str(inventory), str(path)] + list(extra),
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=600, check=False)
    assert "Traceback" not in done.stdout, done.stdout
    return done.returncode, done.stdout


def ours(box):
    """Every name under the unit directory, the plan directory and the fake's /var/lib: what a deployment leaves."""
    found = []
    for directory in (box.fake.unit_dir, box.plans, os.path.join(box.fake.root, "var", "lib")):
        for top, dirs, names in os.walk(directory):
            found += [os.path.join(top, name) for name in dirs + names]
    return sorted(found)


def running(box):
    return {unit: box.fake.show(unit, "ActiveState")["ActiveState"] for unit in ("llm@0.service", "old@0.service")}


def test_a_service_taken_back_leaves_no_file_of_ours_and_a_second_run_changes_nothing(box):
    before = ours(box)
    code, output = play(box, [box.entry()])
    assert code == 0, output
    assert box.serving()[0] == "ok" and os.path.isdir(os.path.join(box.fake.root, "var", "lib", "llm")), output
    assert ours(box) != before
    code, output = play(box, [{"name": "llm", "state": "absent"}], "--check")
    assert code == 0 and box.serving()[0] == "ok", output  # a dry run says, and stops nothing
    code, output = play(box, [{"name": "llm", "state": "absent"}])
    assert code == 0 and _recap(output) == ("1", "0"), output
    assert ours(box) == before, output
    assert running(box)["llm@0.service"] == "inactive"
    assert ["systemctl", "disable", "--", "llm@0.service"] in box.fake.calls()
    code, output = play(box, [{"name": "llm", "state": "absent"}])
    assert code == 0 and _recap(output) == ("0", "0"), output


def test_a_service_taken_back_is_drained_while_it_still_serves_then_stopped(box):
    code, output = play(box, [box.entry()])
    assert code == 0, output
    log = box.tmp_path / "hooks.log"
    # The drain command writes what the instance answered when it ran: it still served, so the drain came first.
    drain = [sys.executable, "-c", "import sys, urllib.request; open(sys.argv[1], 'a').write('drain %s %s %d\\n' "
             "% (sys.argv[2], sys.argv[3], urllib.request.urlopen('http://127.0.0.1:%s/health' % sys.argv[3], "
             "timeout=5).status))", str(log), "{unit}", "{port}"]
    code, output = play(box, [{"name": "llm", "state": "absent", "port_base": box.port, "drain_command": drain}])
    assert code == 0, output
    assert log.read_text() == "drain llm@0.service %d 200\n" % box.port, output
    assert running(box)["llm@0.service"] == "inactive"


def test_a_failed_first_deployment_leaves_nothing(box):
    before = ours(box)
    code, output = play(box, [box.entry(mode="crash")])
    assert code != 0 and "Fail with the reason the deployment failed" in output, output
    assert "stopped: its first deployment, nothing to go back to" in output
    assert ours(box) == before, output
    assert running(box)["llm@0.service"] in ("inactive", "failed")


def test_a_service_dropped_from_the_inventory_is_warned_about_then_taken_back_by_inference_service_remove(box):
    """The last run lists no service: the role still runs for inference_service_remove (site.yml runs it then)."""
    code, output = play(box, [box.entry(), box.entry(name="old", port_base=box.port + 1)])
    assert code == 0, output
    code, output = play(box, [box.entry()])
    assert code == 0 and _recap(output)[0] == "0", output
    warnings = [line for line in warnings_in(output) if "is not in inference_service_list" in line]
    assert len(warnings) == 1 and "old is deployed on this host" in warnings[0], output
    assert "inference_service_remove" in warnings[0]
    assert running(box) == {"llm@0.service": "active", "old@0.service": "active"}  # warned, not touched
    # No service listed at all: old is taken back, and llm, dropped now too, is warned about and left running.
    code, output = play(box, [], inference_service_remove=["old"])
    assert code == 0, output
    warnings = [line for line in warnings_in(output) if "is not in inference_service_list" in line]
    assert len(warnings) == 1 and "llm is deployed on this host" in warnings[0], output
    assert running(box) == {"llm@0.service": "active", "old@0.service": "inactive"}
    assert not [path for path in ours(box) if "old" in os.path.basename(path)], ours(box)


def account(kind, name):
    return subprocess.run(["getent", kind, name], stdout=subprocess.DEVNULL, check=False).returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="creates and removes a system account: needs root")
def test_a_failed_first_deployment_removes_the_accounts_it_created_and_never_one_it_found(box):
    name = "inftest%d" % os.getpid()
    before = ours(box)
    try:
        code, output = play(box, [box.entry(mode="crash", create_user=True, user=name)])
        assert code != 0 and "removed user %s" % name in output, output
        assert not account("passwd", name) and not account("group", name)
        assert ours(box) == before, output
    finally:
        subprocess.run(["userdel", name], stderr=subprocess.DEVNULL, check=False)
        subprocess.run(["groupdel", name], stderr=subprocess.DEVNULL, check=False)
    # root runs this one and was found, not made: taking the service back leaves root alone
    code, output = play(box, [box.entry()])
    assert code == 0, output
    code, output = play(box, [{"name": "llm", "state": "absent"}])
    assert code == 0 and "removed user" not in output and account("passwd", "root"), output
