"""Container services: the run command a service's container entry becomes, the plan's flags for each runtime, the
entry's checks, the preflight's refusal of what a runtime cannot apply, and a docker container found by the audit."""

import os

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import replica
from ansible_collections.inferops.numa.plugins.module_utils.numa.base import containers, tokens
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.read import audit, systemctl
from ansible_collections.inferops.numa.plugins.module_utils.numa.read import preflight as host
from ansible_collections.inferops.numa.plugins.plugin_utils import preflight

from tests.unit.test_audit import FakeSystemd, write_process
from tests.fixtures import sysfs

BIND1 = {"policy": "bind", "mem_nodes": [1], "cpulist": "2-3", "env": {"OMP_NUM_THREADS": "2"}, "instance": 1,
         "port": 8081, "engine": {"engine": "generic", "args": []}}
VLLM = {"name": "vllm", "layout": "per_node", "port_base": 8000, "command": ["--port", "{port}"],
        "environment": {"HF_TOKEN": "x"},
        "container": {"image": "docker.io/vllm/vllm-openai:v0.11.0", "volumes": ["/srv/models:/models:ro"]}}
CONTAINER_ID = "0123456789abcdef" * 4


# --- the run command and the plan's flags ------------------------------------------------------------------

def test_an_entry_becomes_podman_run_with_its_name_volumes_environment_names_and_image():
    (entry,), problems = preflight.check_entries([VLLM], {})
    assert problems == []
    assert entry["command"] == [
        "/usr/bin/podman", "run", "--rm", "--replace", "--cgroups=split", "--sdnotify=conmon",
        "--name", "vllm-{instance}", "--network", "host", "--volume", "/srv/models:/models:ro", "--env", "HF_TOKEN",
        "docker.io/vllm/vllm-openai:v0.11.0", "--port", "{port}"]
    # Root without an account or sandbox; podman's readiness comes from conmon.
    assert (entry["user"], entry["group"], entry["create_user"], entry["hardening"]) == ("root", "root", False, False)
    assert entry["type"] == "notify" and entry["extra_settings"] == {"NotifyAccess": "all", "Delegate": "yes"}


def test_a_docker_entry_writes_its_container_id_where_the_audit_reads_it():
    entry = dict(VLLM, container=dict(VLLM["container"], runtime="docker", pull="never"), type="simple")
    (checked,), problems = preflight.check_entries([entry], {})
    assert problems == []
    assert checked["command"][:2] == ["/usr/bin/docker", "run"]
    assert checked["command"][checked["command"].index("--cidfile") + 1] == "/run/inferops-numa-vllm-{instance}.cid"
    assert checked["command"][-4:-2] == ["--pull", "never"] or "--pull" in checked["command"]
    assert checked["type"] == "simple" and checked["extra_settings"] == {}
    cleanup = [["/usr/bin/docker", "rm", "--force", "vllm-{instance}"],
               ["/bin/rm", "-f", "/run/inferops-numa-vllm-{instance}.cid"]]
    assert containers.unit_commands(checked["container"], "vllm", 30) == {
        "ExecStartPre": cleanup, "ExecStop": [["/usr/bin/docker", "stop", "--time", "30", "vllm-{instance}"]],
        "ExecStopPost": cleanup}


def test_a_podman_container_is_stopped_by_podman_and_removed_after():
    """Measured in the lab: a server as the container's PID 1 ignored systemd's SIGTERM (stopped only by the 20 s
    timeout's SIGKILL, its container left behind); podman's stop needs Delegate=yes under --cgroups=split."""
    (entry,), _ = preflight.check_entries([VLLM], {})
    assert containers.unit_commands(entry["container"], "vllm") == {
        "ExecStop": [["/usr/bin/podman", "stop", "--ignore", "--time", "10", "vllm-{instance}"]],
        "ExecStopPost": [["/usr/bin/podman", "rm", "--force", "--ignore", "vllm-{instance}"]]}
    assert entry["extra_settings"]["Delegate"] == "yes"


@pytest.mark.parametrize("change, words", [
    ({"user": "llm"}, "user: cannot be given with container"),
    ({"hardening": True}, "hardening: cannot be given with container"),
    ({"container": {"runtime": "podman"}}, "container: image: missing"),
    ({"container": {"image": "x", "runtime": "lxc"}}, "container: runtime: 'lxc' is not one of its choices"),
    ({"container": {"image": "x", "options": ["--cpuset-cpus=0-3"]}}, "container options --cpuset-cpus are set by"),
    ({"container": {"image": "x", "options": ["-d"]}}, "container options -d are set by"),
    ({"container": {"image": "x", "imag": "y"}}, "container: imag: no such key; did you mean image?"),
    ({"container": "docker.io/x"}, "give a mapping"),
])
def test_what_a_container_service_cannot_take_is_named_in_one_line(change, words):
    _, problems = preflight.check_entries([dict(VLLM, **change)], {})
    assert len(problems) == 1 and words in problems[0], problems
    assert problems[0].startswith("service vllm: ")


def test_a_container_entry_needs_no_command_and_a_bare_one_still_does():
    assert preflight.check_entries([dict(VLLM, command=None)], {})[1] == []
    assert "command: missing" in preflight.check_entries([{"name": "bare"}], {})[1][0]


def test_the_plans_flags_go_after_run_with_tokens_filled_and_engine_arguments_last():
    plan = dict(BIND1, engine={"engine": "vllm", "args": ["--numa-bind"]})
    argv, kept = tokens.server_command(["/usr/bin/podman", "run", "--name", "vllm-{instance}", "img", "--port",
                                        "{port}"], plan, "podman")
    assert argv == ["/usr/bin/podman", "run", "--cpuset-cpus", "2-3", "--cpuset-mems", "1",
                    "--env", "OMP_NUM_THREADS=2", "--name", "vllm-1", "img", "--port", "8081", "--numa-bind"]
    assert kept == []


@pytest.mark.parametrize("policy, mems", [("bind", ["--cpuset-mems", "1"]), ("interleave", ["--cpuset-mems", "1"]),
                                          ("weighted_interleave", ["--cpuset-mems", "1"]), ("preferred", [])])
def test_podman_confines_memory_except_where_the_plan_only_prefers_a_node(policy, mems):
    flags = containers.plan_flags("podman", dict(BIND1, policy=policy))
    assert flags[:2] == ["--cpuset-cpus", "2-3"] and flags[2:2 + len(mems)] == mems


@pytest.mark.parametrize("policy", ["interleave", "weighted_interleave", "preferred"])
def test_docker_refuses_every_policy_but_bind(policy):
    with pytest.raises(NumaError, match="container runtime docker applies only a cgroup cpuset"):
        containers.plan_flags("docker", dict(BIND1, policy=policy))
    assert containers.policy_problem("docker", "bind") is None
    assert containers.plan_flags("docker", dict(BIND1, policy=policy), bound=False)[:1] == ["--env"]


def test_gpus_are_renumbered_in_bus_order_as_the_container_sees_them():
    env, devices = containers.container_gpus({"CUDA_VISIBLE_DEVICES": "3,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                              "ROCR_VISIBLE_DEVICES": "5", "OMP_NUM_THREADS": "8"})
    assert env == {"CUDA_VISIBLE_DEVICES": "1,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "ROCR_VISIBLE_DEVICES": "0",
                   "OMP_NUM_THREADS": "8"}
    assert devices == ["nvidia.com/gpu=3", "nvidia.com/gpu=1", "amd.com/gpu=5"]


def test_a_command_that_is_no_run_command_is_refused():
    with pytest.raises(NumaError, match="does not start with the runtime's program and 'run'"):
        tokens.server_command(["/usr/bin/podman", "create", "img"], BIND1, "podman")


def test_a_replicated_model_is_mounted_from_its_copy_and_the_server_keeps_its_path_inside():
    argv = ["/usr/bin/podman", "run", "--volume", "/srv/m.gguf:/srv/m.gguf:ro", "img", "-m", "/srv/m.gguf"]
    assert replica.point_at_replicas(argv, {"/srv/m.gguf": "/var/lib/llama/node1/m.gguf"}, mounted=True) == [
        "/usr/bin/podman", "run", "--volume", "/var/lib/llama/node1/m.gguf:/srv/m.gguf:ro", "img", "-m", "/srv/m.gguf"]


def test_a_container_that_mounts_no_model_file_is_told_to_mount_it():
    argv = ["/usr/bin/podman", "run", "--volume", "/srv:/srv:ro", "img", "-m", "/srv/m.gguf"]
    with pytest.raises(NumaError, match="no volume's host side is the model path /srv/m.gguf.*mount the model file"):
        replica.point_at_replicas(argv, {"/srv/m.gguf": "/var/lib/llama/node1/m.gguf"}, mounted=True)


# --- the preflight: what a runtime cannot apply, before any change ---------------------------------------------

def _two_nodes(tmp_path):
    machine = sysfs.Machine()
    for node in range(2):
        machine.add_cpus([2 * node, 2 * node + 1], package=node, core_base=2 * node)
        machine.add_node(node, [2 * node, 2 * node + 1], 4 * 1024 * 1024, 3 * 1024 * 1024,
                         distances=[10, 21] if node == 0 else [21, 10])
    return machine.finish(online=range(4), nodes=range(2), has_cpu=range(2), has_memory=range(2),
                          total_kb=8 * 1024 * 1024, free_kb=6 * 1024 * 1024).write(str(tmp_path / "host"))


def test_the_preflight_refuses_an_interleaved_docker_instance_and_passes_podmans(tmp_path):
    root = _two_nodes(tmp_path)
    big = dict(VLLM, layout="single", model_size="5G", memory_headroom="0")
    (podman,), _ = preflight.check_entries([big], {})
    (docker,), _ = preflight.check_entries([dict(big, container=dict(VLLM["container"], runtime="docker"))], {})
    found = host.service_findings(root, docker, host.read(root), None)[0]
    assert [problem for problem in found if "docker applies only a cgroup cpuset" in problem and "cannot interleave" in problem]
    assert [problem for problem in host.service_findings(root, podman, host.read(root), None)[0]
            if "cgroup cpuset" in problem] == []


# --- the audit: a docker container's processes, found through its id file ---------------------------------------

def _docker_host(root, pids, cid=CONTAINER_ID):
    os.makedirs(os.path.join(root, "run"), exist_ok=True)
    with open(os.path.join(root, "run", "inferops-numa-vllm-1.cid"), "w") as handle:
        handle.write(cid)
    scope = os.path.join(root, "sys", "fs", "cgroup", "system.slice", "docker-%s.scope" % CONTAINER_ID)
    os.makedirs(scope, exist_ok=True)
    with open(os.path.join(scope, "cgroup.procs"), "w") as handle:
        handle.write("".join("%d\n" % pid for pid in pids))


def _unit_props():
    return {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "Result": "success",
            "MainPID": "4000", "ControlGroup": "/system.slice/system-vllm.slice/vllm@1.service"}


@pytest.mark.parametrize("node, ok", [(1, True), (0, False)])
def test_a_docker_containers_pages_are_judged_like_a_bare_servers(tmp_path, node, ok):
    """The client (pid 4000, unit cgroup unreadable: its MainPID) and the container's server (pid 4100, found by the
    id file) are both judged: a server whose memory is on the wrong node fails the audit."""
    root = str(tmp_path)
    _docker_host(root, [4100])
    write_process(root, 4000, "7f00 bind:1 anon=10 N1=10 kernelpagesize_kB=4\n", [(4000, "2-3", 2)], name="docker")
    write_process(root, 4100, "7f00 default anon=5000 N%d=5000 kernelpagesize_kB=4\n" % node, [(4100, "2-3", 3)],
                  name="vllm")
    plan = dict(BIND1, container="docker")
    report = audit.audit_unit(root, "vllm@1.service", plan, run=FakeSystemd(_unit_props()), page_size=4096)
    assert sorted(process["pid"] for process in report["processes"]) == [4000, 4100]
    assert report["ok"] is ok


@pytest.mark.parametrize("content, words", [("not-an-id\n", "holds no container id"),
                                            (CONTAINER_ID.upper(), "holds no container id")])
def test_a_container_id_file_that_holds_no_id_is_refused(tmp_path, content, words):
    _docker_host(str(tmp_path), [4100], cid=content)
    with pytest.raises(NumaError, match=words):
        systemctl.container_pids(str(tmp_path), "/run/inferops-numa-vllm-1.cid")


def test_a_planted_link_for_the_id_file_is_not_followed(tmp_path):
    _docker_host(str(tmp_path), [4100])
    target = tmp_path / "run" / "inferops-numa-vllm-1.cid"
    target.rename(tmp_path / "elsewhere")
    target.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(NumaError, match="cannot read the container id file"):
        systemctl.container_pids(str(tmp_path), "/run/inferops-numa-vllm-1.cid")


def test_a_container_that_is_not_running_is_named(tmp_path):
    os.makedirs(tmp_path / "run")
    (tmp_path / "run" / "inferops-numa-vllm-1.cid").write_text(CONTAINER_ID)
    with pytest.raises(NumaError, match="no cgroup holds the container 0123456789ab"):
        systemctl.container_pids(str(tmp_path), "/run/inferops-numa-vllm-1.cid")
    assert audit.instance_pids(str(tmp_path), "vllm@1.service", {"MainPID": "7"}, BIND1) == [7]


def test_the_metrics_read_a_docker_instances_runtime_from_its_record_and_refuse_another():
    from ansible_collections.inferops.numa.plugins.module_utils.numa.decide import records

    written = dict(BIND1, container="docker")
    assert records.plan_problem(written) == ""
    assert records.plan_fields(written)["container"] == "docker"
    assert "container 'lxc' is none of the runtimes" in records.plan_problem(dict(BIND1, container="lxc"))
    assert "container" not in records.plan_fields(BIND1)


def test_a_docker_plan_on_a_unit_that_is_no_instance_is_refused_in_one_line(tmp_path):
    with pytest.raises(NumaError, match="audit the service's instance unit"):
        audit.instance_pids(str(tmp_path), "vllm.service", {"MainPID": "7"}, dict(BIND1, container="docker"))
