"""The deployment in the container: the stand-in instance active and pinned as its plan says, the plan record, a
check-mode run and a refused run that change nothing, and the snapshot that shows what a deployment adds."""

import json
import urllib.request

import yaml

from conftest import (CONVERGE_OWN, SERVICES_FILE, TIMER_OWN, converge, differences, fresh_snapshot, ports, recap_changed,
                      site, snapshot)

UNIT = "standin@0.service"


def _status_field(text: str, field: str) -> str:
    return next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(field + ":"))


def test_the_instance_is_active_and_answers(host, plan):
    assert host.service(UNIT).is_running, host.run("journalctl --no-pager -q -n 20 -u %s" % UNIT).stdout
    # Host network: the container's port is the controller's too.
    with urllib.request.urlopen("http://127.0.0.1:%d/health" % plan["port"], timeout=10) as answer:
        assert answer.status == 200 and json.load(answer)["status"] == "ok"


def test_the_instance_is_pinned_as_its_plan_says(host, plan):
    pid = host.service(UNIT).systemd_properties["MainPID"]
    assert pid not in ("", "0"), "%s has no main process" % UNIT
    status = host.file("/proc/%s/status" % pid).content_string
    # The plan reserves CPU 1 (vars/services.yml): its CPUs are fewer than PID 1's, so a process the launcher did not
    # pin (allowed every CPU of the container) cannot pass by chance.
    everything = _status_field(host.file("/proc/1/status").content_string, "Cpus_allowed_list")
    assert plan["cpulist"] != everything, "the plan takes every CPU (%s): the pinning would not show" % everything
    assert _status_field(status, "Cpus_allowed_list") == plan["cpulist"]
    # Every thread, not only the main one (the stand-in answers from a thread per request).
    found = host.run("grep -h '^Cpus_allowed_list:' /proc/%s/task/*/status" % pid)
    assert found.rc == 0, found.stderr
    assert {line.split(":", 1)[1].strip() for line in found.stdout.splitlines()} == {plan["cpulist"]}
    assert _status_field(status, "Mems_allowed_list") == ",".join(str(node) for node in plan["mem_nodes"])


def test_the_plan_record_is_present_and_says_what_was_asked(host, plan):
    record = host.file("/etc/inferops-numa/standin@0.plan.json")
    assert (record.user, record.group) == ("root", "root")
    # vars/services.yml: node 0, CPU 1 reserved, the first of create.yml's ports; a node's memory is bound.
    assert (plan["node"], plan["port"], plan["policy"], plan["mem_nodes"]) == (0, ports()[0], "bind", [0])
    assert 1 not in plan["cpus"] and plan["cpus"]
    assert host.file("/etc/inferops-numa/standin.audit.json").is_file


def test_the_snapshot_sees_what_the_deployment_added():
    # The removal check trusts this comparison to find what is left: it must find what the deployment added.
    added = differences(fresh_snapshot(), snapshot(), ignore=CONVERGE_OWN)
    for item in ("+ users standin", "+ groups standin", "+ files /etc/inferops-numa/standin@0.plan.json",
                 "+ files /usr/local/bin/numa-pin", "+ files /etc/systemd/system/standin@.service",
                 "+ units standin@0.service", "+ unit_files inferops-numa-metrics.timer"):
        assert item in added, "%s not among the changes since the fresh container:\n%s" % (item, "\n".join(added))
    assert not any(line.startswith("+ files /opt/inferops-container") for line in added)


def test_balancing_is_set_and_persisted_and_its_original_recorded(host):
    # lab/container.py's stand-in for the kernel's knob booted at 1; auto is disabled on this one-node host.
    assert host.file("/proc/sys/kernel/numa_balancing").content_string.strip() == "0"
    assert host.file("/etc/sysctl.d/60-inferops-numa.conf").content_string.count("kernel.numa_balancing = 0") == 1
    original = json.loads(host.file("/var/lib/inferops-numa/originals/numa_balancing.json").content_string)
    assert "1" in json.dumps(original), original  # what numa_host_state absent puts back
    added = differences(fresh_snapshot(), snapshot(), ignore=CONVERGE_OWN)
    assert "~ knobs /proc/sys/kernel/numa_balancing: 1 -> 0" in added, "\n".join(added)


def test_a_check_mode_run_with_changed_services_changes_nothing():
    # Changes a run would make (another CPU reserved: a new plan and a restart; a second service: a user, a unit, a
    # start), so the dry run has something to not do.
    services = {"inference_service_list": [
        {"name": "standin", "layout": "single", "node": 0, "reserve_cpus": "0",
         "command": ["/usr/bin/python3", "/opt/inferops-container/standin_engine.py", "--port", "{port}", "--mode",
                     "ok"],
         "port_base": ports()[0], "health_url": "http://127.0.0.1:{port}/health", "model_size": "32M",
         "memory_headroom": "16M", "pages": "anon"},
        {"name": "standin-dry", "layout": "single", "node": 0,
         "command": ["/usr/bin/python3", "/opt/inferops-container/standin_engine.py", "--port", "{port}", "--mode",
                     "ok"],
         "port_base": ports()[1], "model_size": "32M", "memory_headroom": "16M", "pages": "anon"}]}
    before = snapshot()
    run = site("--check", "--diff", "-e", json.dumps(services))
    after = snapshot()
    assert run.returncode == 0, run.stdout[-3000:]
    assert recap_changed(run.stdout) > 0, "the dry run found nothing to change:\n%s" % run.stdout[-3000:]
    assert "would start standin-dry@0.service" in run.stdout, run.stdout[-3000:]
    assert differences(before, after, ignore=TIMER_OWN) == []


def test_a_refused_run_says_why_in_one_line_and_changes_nothing():
    before = snapshot()
    run = site("-e", "numa_host_metrics_period_seconds=5")
    after = snapshot()
    assert run.returncode != 0
    expected = ("preflight: numa-container: numa_host_metrics_period_seconds: 5 is out of range; give a value from 10 "
                "to 86400")
    assert any(expected in line for line in run.stdout.splitlines()), run.stdout[-3000:]
    # Stopped in the preflight play, before the play that changes hosts started.
    assert "PLAY [Prepare each NUMA host" not in run.stdout, run.stdout[-3000:]
    assert differences(before, after, ignore=TIMER_OWN) == []


def _hook_lines(host) -> list:
    log = host.file("/opt/inferops-container/hooks.log")
    return log.content_string.splitlines() if log.exists else []


def test_a_restart_is_drained_before_the_old_process_stops_and_undrained_after_the_new_one_passed(host, request):
    with open(SERVICES_FILE) as handle:
        entries = yaml.safe_load(handle)["inference_service_list"]
    old_pid = host.service(UNIT).systemd_properties["MainPID"]
    before = _hook_lines(host)
    # A changed environment changes the unit: one restart of the instance, behind its gates.
    changed = {"inference_service_list": [dict(entry, port_base=ports()[0], environment={"INFEROPS_HOOK_CHECK": "1"})
                                          for entry in entries]}
    run = site("-e", json.dumps(changed))
    request.addfinalizer(converge)  # the deployment as converge made it, for the checks after this one
    assert run.returncode == 0, run.stdout[-3000:]
    new_pid = host.service(UNIT).systemd_properties["MainPID"]
    assert new_pid != old_pid, "the instance was not restarted"
    assert _hook_lines(host)[len(before):] == ["drain %s %s" % (UNIT, old_pid), "undrain %s %s" % (UNIT, new_pid)]
