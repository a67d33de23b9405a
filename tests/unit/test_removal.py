"""Taking a service back (act/removal): its instances stopped and disabled, its files and records removed, and only
what its created record says the role made; a record that cannot be trusted is not acted on; the names of what is
ours come from decide/records."""
import os

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import change_files, removal, rollout
from ansible_collections.inferops.numa.plugins.module_utils.numa.act.hooks import Hooks
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide import records
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.rollout import record_text
from tests.unit.test_rollout import FakeSystemd

ACCOUNT_COMMANDS = ("userdel", "groupdel")


class Host(FakeSystemd):
    """The unit test's systemctl, with userdel and groupdel recorded (never run)."""

    def run(self, argv):
        if argv[0] in ACCOUNT_COMMANDS:
            self.calls.append(argv)
            return 0, "", ""
        return super().run(argv)


@pytest.fixture
def host_dirs(trusted_dir):
    plans, units, root = (os.path.join(trusted_dir, name) for name in ("plans", "units", "root"))
    for path in (plans, units, os.path.join(root, "var", "lib")):
        os.makedirs(path)
    return removal.Options(plans, units, root)


def deployed(options, service="llm", count=2, others=()):
    """What the role leaves for ``service``: the template, two plan records and drop-ins, its audit record, and
    another service's files beside them."""
    files = {os.path.join(options.unit_dir, "%s@.service" % service): "[Service]\n",
             os.path.join(options.record_dir, records.audit_record_name(service)): "{}\n"}
    for index in range(count):
        files[os.path.join(options.record_dir, records.plan_record_name(service, index))] = "{}\n"
        files[os.path.join(options.unit_dir, "%s@%d.service.d" % (service, index), "50-inferops-numa.conf")] = "x\n"
    for other in others:
        files[os.path.join(options.unit_dir, "%s@.service" % other)] = "[Service]\n"
        files[os.path.join(options.record_dir, records.plan_record_name(other, 0))] = "{}\n"
    assert change_files.write_files(files) == []


def listing(options):
    return sorted(os.path.relpath(os.path.join(top, name), os.path.dirname(options.record_dir))
                  for directory in (options.record_dir, options.unit_dir, options.root)
                  for top, dirs, names in os.walk(directory) for name in dirs + names)


def test_a_service_taken_back_leaves_nothing_of_it_and_a_second_run_changes_nothing(host_dirs):
    deployed(host_dirs, others=["llm-big"])
    before_others = [path for path in listing(host_dirs) if "llm-big" in path]
    host = Host(active=["llm@0.service", "llm@1.service"])
    result = removal.remove_services(["llm"], host_dirs, host.host(), check=False)
    assert result["changed"] and not result["failed"], result
    assert listing(host_dirs) == sorted(before_others + ["root/var", "root/var/lib"])
    assert host.actions() == [["stop", "llm@0.service"], ["disable", "llm@0.service"], ["stop", "llm@1.service"],
                              ["disable", "llm@1.service"], ["daemon-reload"]]
    again = removal.remove_services(["llm"], host_dirs, host.host(), check=False)
    assert not again["changed"] and again["removed"] == {} and len(host.actions()) == 5


def test_check_mode_says_what_it_would_do_and_does_nothing(host_dirs):
    deployed(host_dirs)
    before = listing(host_dirs)
    host = Host(active=["llm@0.service"])
    result = removal.remove_services(["llm"], host_dirs, host.host(), check=True)
    assert result["changed"] and "stopped and disabled llm@0.service" in result["removed"]["llm"]
    assert listing(host_dirs) == before and host.actions() == []


def test_only_what_the_created_record_names_is_removed_and_that_record_goes_last(host_dirs):
    deployed(host_dirs)
    state = os.path.join(host_dirs.root, "var", "lib", "llm")
    # daemon stands for an account the role made (userdel and groupdel are only recorded here)
    assert removal.record_created(host_dirs.record_dir, "llm", {"user": "daemon", "group": "daemon",
                                                                 "state_directory": "/var/lib/llm"},
                                  host_dirs.root, check=False)
    os.makedirs(os.path.join(state, "node0"))  # what systemd and numa-pin made after
    with open(os.path.join(state, "node0", "abc-model.gguf"), "w") as handle:
        handle.write("replica")
    os.symlink("/etc", os.path.join(state, "planted"))  # removed as a link, never followed
    host = Host()
    result = removal.remove_services(["llm"], host_dirs, host.host(), check=False)
    assert not result["failed"], result
    assert [call for call in host.calls if call[0] in ACCOUNT_COMMANDS] == [["userdel", "--", "daemon"],
                                                                          ["groupdel", "--", "daemon"]]
    assert not os.path.exists(state) and os.path.isfile("/etc/passwd")
    assert result["removed"]["llm"][-4:] == ["removed /var/lib/llm", "removed user daemon", "removed group daemon",
                                             "removed %s from %s" % (records.created_record_name("llm"),
                                                                     host_dirs.record_dir)]


def test_a_state_directory_of_another_owner_is_refused_and_the_record_kept(host_dirs):
    state = os.path.join(host_dirs.root, "var", "lib", "llm")
    removal.record_created(host_dirs.record_dir, "llm", {"state_directory": "/var/lib/llm"}, host_dirs.root, False)
    os.makedirs(state)
    os.chown(state, 4242, 4242)
    result = removal.remove_services(["llm"], host_dirs, Host().host(), check=False)
    assert result["failed"] and "owned by uid 4242" in result["msg"] and os.path.isdir(state)
    assert os.listdir(host_dirs.record_dir) == [records.created_record_name("llm")]


def test_an_account_the_role_found_is_never_recorded_and_root_never(host_dirs):
    assert not removal.record_created(host_dirs.record_dir, "llm", {"user": None, "group": None,
                                                                     "state_directory": None}, host_dirs.root, False)
    os.makedirs(os.path.join(host_dirs.root, "var", "lib", "llm"))  # there before the first start: the operator's
    assert not removal.record_created(host_dirs.record_dir, "llm", {"state_directory": "/var/lib/llm"},
                                      host_dirs.root, False)
    with pytest.raises(NumaError, match="user 'root' is not an account name"):
        removal.record_created(host_dirs.record_dir, "llm", {"user": "root"}, host_dirs.root, False)
    assert os.listdir(host_dirs.record_dir) == []


def test_an_untrusted_created_record_is_not_acted_on(host_dirs):
    deployed(host_dirs)
    name = os.path.join(host_dirs.record_dir, records.created_record_name("llm"))
    with open(name, "w") as handle:
        handle.write(record_text({"user": "daemon"}))
    os.chmod(name, 0o666)
    before = listing(host_dirs)
    host = Host(active=["llm@0.service"])
    result = removal.remove_services(["llm"], host_dirs, host.host(), check=False)
    assert result["failed"] and "llm left as it is: ignoring %s" % name in result["msg"]
    assert listing(host_dirs) == before and host.actions() == []
    with pytest.raises(NumaError, match="ignoring %s" % name):  # nor written over
        removal.record_created(host_dirs.record_dir, "llm", {"user": "llm"}, host_dirs.root, False)


def test_an_instance_that_does_not_stop_keeps_its_files(host_dirs):
    deployed(host_dirs, count=1)
    before = listing(host_dirs)
    host = Host(active=["llm@0.service"], fails={("stop", "llm@0.service"): 1})
    result = removal.remove_services(["llm"], host_dirs, host.host(), check=False)
    assert result["failed"] and "not stopped and disabled llm@0.service" in result["msg"]
    assert listing(host_dirs) == before


def test_a_drop_in_directory_with_someone_elses_files_is_kept_with_them(host_dirs):
    deployed(host_dirs, count=1)
    other = os.path.join(host_dirs.unit_dir, "llm@0.service.d", "10-operator.conf")
    with open(other, "w") as handle:
        handle.write("[Service]\n")
    host = Host()
    result = removal.remove_services(["llm"], host_dirs, host.host(), check=False)
    assert not result["failed"] and os.listdir(os.path.dirname(other)) == ["10-operator.conf"]
    again = removal.remove_services(["llm"], host_dirs, host.host(), check=False)
    assert not again["changed"] and again["removed"] == {}, again


def test_a_planted_link_for_a_drop_in_directory_is_refused_and_nothing_done(host_dirs):
    deployed(host_dirs, count=1)
    os.symlink("/etc", os.path.join(host_dirs.unit_dir, "llm@1.service.d"))
    before = listing(host_dirs)
    host = Host()
    result = removal.remove_services(["llm"], host_dirs, host.host(), check=False)
    assert result["failed"] and "llm left as it is: refusing the directory" in result["msg"], result
    assert listing(host_dirs) == before and host.actions() == []


def test_the_services_deployed_but_not_listed_are_the_orphans(host_dirs):
    deployed(host_dirs, others=["old"])
    assert removal.deployed_services(host_dirs.record_dir) == ["llm", "old"]
    assert removal.orphans(host_dirs.record_dir, ["llm"], []) == ["old"]
    assert removal.orphans(host_dirs.record_dir, ["llm"], ["old"]) == []
    assert "add it to inference_service_remove" in removal.orphan_warning("old", host_dirs.record_dir)


def test_which_service_a_record_belongs_to():
    assert [records.record_service(name) for name in ("llm@0.plan.json", "llm.audit.json", "llm.rejected.json",
                                                      "llm.created.json", "a@b@1.plan.json")] == ["llm"] * 4 + [None]
    for name in ("llm@01.plan.json", "ab-gates.json", records.PENDING, "-x.audit.json", "..audit.json"):
        assert records.record_service(name) is None
    assert records.service_record_names("llm", ["llm.created.json", "llm@0.plan.json", "llmx.audit.json"]) == [
        "llm@0.plan.json", "llm.created.json"]
    assert records.created_problem({"user": "llm", "group": "llm", "state_directory": "/var/lib/llm"}) == ""
    assert "not /var/lib/<service>" in records.created_problem({"state_directory": "/etc"})
    assert "unknown key" in records.created_problem({"home": "/"})


def test_an_account_another_of_our_services_runs_as_is_handed_to_it_not_removed(host_dirs):
    deployed(host_dirs, others=["big"])
    assert change_files.write_files({os.path.join(host_dirs.unit_dir, "big@.service"):
                                     "[Service]\nUser=daemon\nGroup=daemon\n"}) == []
    removal.record_created(host_dirs.record_dir, "llm", {"user": "daemon", "group": "daemon"}, host_dirs.root, False)
    host = Host()
    result = removal.remove_services(["llm"], host_dirs, host.host(), check=False)
    assert not result["failed"], result
    assert [call for call in host.calls if call[0] in ACCOUNT_COMMANDS] == []
    assert "handed user daemon to big, which runs as it" in result["removed"]["llm"]
    assert change_files.read_record(host_dirs.record_dir, records.created_record_name("big"), "") == {
        "user": "daemon", "group": "daemon"}


def _hooked(host, ran, rc=0):
    """The fake systemd's Host whose hooks are recorded (argv, deadline) and end with ``rc``."""
    def hook(argv, seconds):
        ran.append((list(argv), seconds))
        return rc, "", "" if rc == 0 else "backend llm/llm@0.service: no such server\n"
    return rollout.Host(host.run, lambda instance, seconds: None, lambda gate: pytest.fail("no gate"),
                        lambda: host.now, host._sleep, hook=hook)


def test_a_running_instance_is_drained_with_its_recorded_port_before_it_is_stopped(host_dirs):
    deployed(host_dirs)
    change_files.write_files({os.path.join(host_dirs.record_dir, records.plan_record_name("llm", 0)):
                              '{"port": 8080}\n'})
    drains = {"llm": Hooks(drain=("lb", "drain", "{unit}", "{port}"), seconds=5.0, drain_seconds=2.0)}
    options = host_dirs._replace(drains=drains)
    systemd, ran = Host(active=["llm@0.service"]), []
    result = removal.remove_services(["llm"], options, _hooked(systemd, ran), check=False)
    assert not result["failed"], result
    # llm@1 does not run: nothing to drain; the grace once, before the first stop.
    assert ran == [(["lb", "drain", "llm@0.service", "8080"], 5.0)]
    assert systemd.now == 2.0 and result["removed"]["llm"][0] == "drained llm@0.service"
    assert [call for call in systemd.calls if call[0] == "stop"] == [["stop", "llm@0.service"],
                                                                     ["stop", "llm@1.service"]]


def test_a_failed_drain_stops_nothing_and_removes_nothing(host_dirs):
    deployed(host_dirs)
    before = listing(host_dirs)
    options = host_dirs._replace(drains={"llm": Hooks(drain=("lb", "drain", "{unit}"))})
    systemd, ran = Host(active=["llm@0.service", "llm@1.service"]), []
    result = removal.remove_services(["llm"], options, _hooked(systemd, ran, rc=1), check=False)
    assert result["failed"] and len(ran) == 1, result
    assert result["msg"] == ("llm@0.service: not stopped: its drain command `lb drain llm@0.service` exited 1: "
                             "backend llm/llm@0.service: no such server; fix the drain command or the load balancer "
                             "and run again")
    assert listing(host_dirs) == before and not [call for call in systemd.calls if call[0] == "stop"]


def test_check_mode_says_it_would_drain_and_runs_no_hook(host_dirs):
    deployed(host_dirs)
    options = host_dirs._replace(drains={"llm": Hooks(drain=("lb", "drain", "{unit}"))})
    systemd, ran = Host(active=["llm@1.service"]), []
    result = removal.remove_services(["llm"], options, _hooked(systemd, ran), check=True)
    assert ran == [] and result["removed"]["llm"][0] == "would drain llm@1.service", result

