"""site.yml's batches through ansible-playbook: a host's changes and its service restarts in one batch, a canary host
first, the first failed host stops the run, and a stopped run says in one line which hosts it left untouched and why
(the untouched_hosts callback the checkout's ansible.cfg enables).

The roles cannot run here (no systemd as PID 1, and they would change this machine), so each play of site.yml runs
with its own keywords (hosts, serial, max_fail_percentage, any_errors_fatal, vars, tags) and a stub body: a task
that runs on the host (a module, so an unreachable host is found), leaves a mark per host and play, and fails
where the test says. The real playbook's tags are checked with --list-tasks.
"""

import os
import re
import subprocess

import pytest
import yaml

from tests.tools import REPO, ansible_command

SITE = os.path.join(REPO, "playbooks", "site.yml")
HOSTS = ("llm-01", "llm-02", "llm-03")
# A closed port on this machine: ssh is refused at once, and the host is unreachable.
UNREACHABLE = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1,
               "ansible_ssh_common_args": "-o ConnectTimeout=5 -o BatchMode=yes"}


def site_plays():
    with open(SITE) as handle:
        return yaml.safe_load(handle)


def stub_site(tmp_path):
    """site.yml's plays, each with its keywords and a stub body that marks the host and fails where told."""
    plays = []
    for number, play in enumerate(site_plays()):
        stub = {key: value for key, value in play.items() if key not in ("roles", "tasks")}
        stub["become"] = False
        stub["tasks"] = [
            {"name": "Fail where the test says", "ansible.builtin.fail": {"msg": "failed on purpose"},
             "when": "inventory_hostname in (stub_fail[%d] | default([]))" % number},
            {"name": "Mark the host reached", "ansible.builtin.copy": {
                "content": "", "mode": "0644",
                "dest": "{{ stub_marks }}/%d.{{ inventory_hostname }}" % number}},
        ]
        plays.append(stub)
    path = tmp_path / "site-stub.yml"
    path.write_text(yaml.safe_dump(plays, sort_keys=False))
    return path


def run(tmp_path, fail=None, hostvars=None, extra=(), env=None):
    """ansible-playbook on the stub site over three local hosts; (exit code, output, {play number: hosts marked})."""
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    for old in marks.iterdir():
        old.unlink()
    hosts = {host: dict((hostvars or {}).get(host, {})) for host in HOSTS}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts, "vars": {
        "ansible_connection": "local", "ansible_python_interpreter": os.sys.executable}}}))
    variables = tmp_path / "vars.yml"
    variables.write_text(yaml.safe_dump({"stub_marks": str(marks), "stub_fail": fail or {}}))
    env = env or dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
    env = dict(env, ANSIBLE_NOCOLOR="1", ANSIBLE_RETRY_FILES_ENABLED="0")
    done = subprocess.run([ansible_command("ansible-playbook"), "-i", str(inventory), str(stub_site(tmp_path)),
                           "-e", "@%s" % variables] + list(extra),
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300, check=False)
    reached = {}
    for mark in marks.iterdir():
        number, host = mark.name.split(".", 1)
        reached.setdefault(int(number), []).append(host)
    return done.returncode, done.stdout + done.stderr, {number: sorted(hosts) for number, hosts in reached.items()}


def untouched_lines(output):
    return [line for line in output.splitlines() if line.startswith("inferops.numa: ")]


def test_site_runs_both_roles_in_one_batched_play_after_the_preflight():
    preflight, rollout, audit = site_plays()
    assert preflight["any_errors_fatal"] is True and "serial" not in preflight
    # The host prepared before its services; taken back (numa_host_state absent) after them.
    steps = [(task.get("ansible.builtin.import_role") or task.get("ansible.builtin.include_role") or {}).get("name")
             for task in rollout["tasks"]]
    assert [step for step in steps if step] == ["inferops.numa.numa_host", "inferops.numa.inference_service",
                                                "inferops.numa.numa_host"]
    prepare, take_back = [task for task in rollout["tasks"] if "ansible.builtin.import_role" in task]
    assert prepare["when"] == "numa_host_state | default('present') != 'absent'"
    assert take_back["when"] == "numa_host_state | default('present') == 'absent'"
    assert rollout["serial"] == "{{ numa_serial | default([1, '25%']) }}"
    assert rollout["max_fail_percentage"] == "{{ numa_max_fail_percentage | default(0) }}"
    assert rollout["vars"]["inferops_numa_rollout"] is True
    assert audit["tags"] == ["never", "audit"] and "serial" not in audit


def test_the_failed_canary_stops_the_run_and_the_line_names_the_hosts_left_untouched(tmp_path):
    code, output, reached = run(tmp_path, fail={1: ["llm-01"]})
    assert code != 0, output
    assert untouched_lines(output) == [
        "inferops.numa: stopped after llm-01 failed (max_fail_percentage 0): left untouched: llm-02, llm-03"], output
    assert reached == {0: list(HOSTS)}, reached  # the canary failed before its mark; no other host was touched
    assert output.index("inferops.numa: stopped") > output.index("PLAY RECAP"), output  # after the recap


def test_after_the_canary_one_batch_at_a_time_and_the_first_failure_stops(tmp_path):
    code, output, reached = run(tmp_path, fail={1: ["llm-02"]})
    assert code != 0
    assert untouched_lines(output) == [
        "inferops.numa: stopped after llm-02 failed (max_fail_percentage 0): left untouched: llm-03"], output
    assert reached[1] == ["llm-01"], reached
    # 25 % of three hosts is less than one: one host per batch.
    assert len(re.findall(r"^PLAY \[Prepare each NUMA host", output, re.MULTILINE)) == 2, output


def test_a_run_that_reaches_every_host_says_nothing(tmp_path):
    code, output, reached = run(tmp_path)
    assert code == 0, output
    assert untouched_lines(output) == [] and reached == {0: list(HOSTS), 1: list(HOSTS)}
    assert len(re.findall(r"^PLAY \[Prepare each NUMA host", output, re.MULTILINE)) == 3, output


def test_the_old_behaviour_is_one_variable_each_away(tmp_path):
    """All at once and never stopping: the failed host is left out, every other host is deployed."""
    code, output, reached = run(tmp_path, fail={1: ["llm-01"]},
                                extra=["-e", "numa_serial=0", "-e", "numa_max_fail_percentage=100"])
    assert code != 0
    assert reached[1] == ["llm-02", "llm-03"] and untouched_lines(output) == [], output
    assert len(re.findall(r"^PLAY \[Prepare each NUMA host", output, re.MULTILINE)) == 1, output


@pytest.mark.parametrize("serial, batches", [("2", 2), ("67%", 2), ("34%", 3), ('{"numa_serial": [1, 2]}', 2)])
def test_numa_serial_takes_a_count_a_percentage_or_a_list(tmp_path, serial, batches):
    extra = ["-e", serial if serial.startswith("{") else "numa_serial=%s" % serial]
    code, output, reached = run(tmp_path, extra=extra)
    assert code == 0 and reached[1] == list(HOSTS), output
    assert len(re.findall(r"^PLAY \[Prepare each NUMA host", output, re.MULTILINE)) == batches, output


def test_an_unreachable_host_at_the_preflight_stops_the_run_and_says_so(tmp_path):
    code, output, reached = run(tmp_path, hostvars={"llm-03": UNREACHABLE})
    assert code != 0
    assert untouched_lines(output) == [
        "inferops.numa: stopped after llm-03 was unreachable (any_errors_fatal): left untouched: llm-01, llm-02, "
        "llm-03"], output
    assert 1 not in reached, reached


def test_an_unreachable_canary_stops_the_run_and_says_so(tmp_path):
    """Reachable for the preflight, gone when its batch starts: no rescue would run there, the callback still says."""
    # The rollout play's own variable: local for the preflight, ssh to a closed port for the rollout.
    gone = dict(UNREACHABLE, ansible_connection="{{ 'ssh' if inferops_numa_rollout | default(false) else 'local' }}")
    code, output, reached = run(tmp_path, hostvars={"llm-01": gone})
    assert code != 0
    assert untouched_lines(output) == [
        "inferops.numa: stopped after llm-01 was unreachable (whole batch lost): left untouched: llm-02, llm-03"], output
    assert reached == {0: list(HOSTS)}, reached


def test_a_failure_of_a_whole_batch_stops_even_at_max_fail_percentage_100(tmp_path):
    code, output, _reached = run(tmp_path, fail={1: ["llm-01"]}, extra=["-e", "numa_max_fail_percentage=100"])
    assert code != 0
    assert untouched_lines(output) == [
        "inferops.numa: stopped after llm-01 failed (whole batch lost): left untouched: llm-02, llm-03"], output


@pytest.mark.parametrize("enabled", [True, False])
def test_outside_the_checkout_the_callback_says_it_once_enabled(tmp_path, enabled):
    """As an installed collection runs it: no checkout ansible.cfg, the collection on the collections path, the
    callback enabled by the environment (or not, and then nothing says it)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    (tmp_path / "empty.cfg").write_text("[defaults]\n")
    env.update(ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, "build"), ANSIBLE_CONFIG=str(tmp_path / "empty.cfg"))
    if enabled:
        env["ANSIBLE_CALLBACKS_ENABLED"] = "inferops.numa.untouched_hosts"
    code, output, _reached = run(tmp_path, fail={1: ["llm-01"]}, env=env)
    assert code != 0
    expected = ["inferops.numa: stopped after llm-01 failed (max_fail_percentage 0): left untouched: llm-02, llm-03"]
    assert untouched_lines(output) == (expected if enabled else []), output
    assert "PLAY RECAP" in output, output


@pytest.mark.parametrize("tags, wanted", [
    ("preflight", ["Check the roles' variables, each service and what the host offers them"]),
    ("helper", ["Install the numa-pin helper"]),
    ("metrics", ["Refresh the NUMA metrics with a timer", "Remove the metrics timer"]),
    ("balancing", ["Set automatic NUMA balancing", "Handle numad"]),
    ("weights", ["Set the weighted-interleave weights from each memory node's bandwidth"]),
    ("facts", ["Gather NUMA facts"]),
    ("services", ["Deploy the host's inference services"]),
    ("audit", ["Audit the host's deployed instances"]),
])
def test_each_tag_still_selects_its_tasks(tags, wanted):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run([ansible_command("ansible-playbook"), "-i", "inventory/example", "site.yml", "--list-tasks",
                           "--tags", tags], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    for task in wanted:
        assert re.search(r"^\s+(?:[\w.]+ : )?%s\t" % re.escape(task), done.stdout, re.MULTILINE), (task, done.stdout)
    if tags != "audit":
        assert "Audit the host's deployed instances" not in done.stdout
