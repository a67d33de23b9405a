"""Servers in podman containers in the dual-socket lab guest (docs/containers.md).

The module deploys vars/lab_containers.yml beside converge.yml's services and takes them back after its checks
(which proves that a removal leaves no unit, container, record or model copy of theirs, and keeps every other
check's converge from re-checking them): llama-box, llama-server from the stand-in image (made offline from the
guest's own files by lab/guest/make_standin_image.sh) on each node, each container mounting its node's copy of the
model (a slower change gated here); and box-big, a stand-in whose request fits no single node, interleaved.
Each container's server is found from the host through its unit's cgroup (podman keeps it there) and read by the
lab's own parser (conftest.placement), never by numa-pin's audit, which is checked here as well.
"""

import json
import os
import shlex

import pytest
import yaml

from conftest import (GATE, INTERLEAVED_MIN_SHARE, NUMA_PIN, SCENARIO_DIR, converge, ensure_layout, gate_verdicts,
                      journal, node_cpus, placement, read_polls, run_vars, services_vars, share, start_poller,
                      verdicts_since, wait_active, wait_until)

pytestmark = pytest.mark.usefixtures("two_nodes")

BOXES = {"llama-box@0.service": (8130, 0), "llama-box@1.service": (8131, 1)}
BIG = ("box-big@0.service", 8132)
READY_S = 30              # llama-server in its container from start to /health ok
CONTAINER_SERVICES = os.path.join(SCENARIO_DIR, "vars", "lab_containers.yml")
# What a container service may leave, by the names the role gives it: none of it is left after its removal.
LEFT_BY = ("ls -d /etc/systemd/system/{0}@* /etc/systemd/system/*.wants/{0}@* /etc/inferops-numa/{0}[@.]* "
           "/var/lib/{0} 2>/dev/null; "
           "podman ps --all --format '{{{{.Names}}}}' --filter name='^{0}-'; "
           "systemctl list-units --all --plain --no-legend --state=active,activating,deactivating,failed '{0}@*'")


def container_entries(**box_changes):
    """vars/lab_containers.yml's services, llama-box's entry changed by ``box_changes``."""
    with open(CONTAINER_SERVICES) as handle:
        entries = yaml.safe_load(handle)["lab_container_services"]
    return [dict(entry, **box_changes) if entry["name"] == "llama-box" else entry for entry in entries]


@pytest.fixture(scope="module", autouse=True)
def container_services(host, tmp_path_factory):
    """The container services deployed beside converge.yml's for this module's checks, then taken back."""
    ensure_layout(2)
    folder = tmp_path_factory.mktemp("containers")
    others = json.loads(run_vars())["inference_service_list"]
    converge("-e", services_vars(folder, "deployed", others + container_entries()))
    yield
    names = [entry["name"] for entry in container_entries()]
    converge("-e", services_vars(folder, "removed", others, inference_service_remove=names))
    left = {name: host.run(LEFT_BY.format(name)).stdout.split() for name in names}
    assert left == {name: [] for name in names}, "the removal of the container services left: %s" % left
    assert not [unit for unit in gate_verdicts(host) if unit.split("@")[0] in names], gate_verdicts(host)


def container_server(host, unit, comm):
    """The PID of the container's server (named ``comm``), found from the host: the unit's cgroup holds podman,
    conmon and the container's processes (--cgroups=split)."""
    group = host.service(unit).systemd_properties["ControlGroup"]
    listed = host.run("for pid in $(cat $(find %s -name cgroup.procs)); do echo $pid $(cat /proc/$pid/comm); done"
                      % shlex.quote("/sys/fs/cgroup" + group)).stdout.split("\n")
    found = [line.split()[0] for line in listed if line.split()[1:] == [comm]]
    assert len(found) == 1, "%s: %s in its cgroup %s: %s" % (unit, comm, group, listed)
    return int(found[0])


def plan_of(host, unit):
    return json.loads(host.file("/etc/inferops-numa/%s.plan.json" % unit.replace(".service", "")).content_string)


def test_each_containerized_server_runs_on_its_node_with_its_model_copy_there(host):
    wait_active(host, sorted(BOXES))
    for unit, (port, node) in sorted(BOXES.items()):
        wait_until(lambda: host.run("curl -sf -o /dev/null --max-time 10 http://127.0.0.1:%d/health" % port).rc == 0,
                   READY_S, "%s ready" % unit)
        pid = container_server(host, unit, "llama-server")
        where = placement(host, unit, pid)
        assert where["cpus"] == node_cpus(host, node), where
        assert set(where["threads"].values()) == {node_cpus(host, node)}, where["threads"]
        assert share(where["anon"], node) >= 0.99 and share(where["file"], node) >= 0.99, where
        # The container maps its node's copy at the path the server was given (the host's copy under the state dir).
        printed = journal(host, unit[:-len(".service")])
        assert ("copied the model to /var/lib/llama-box/node%d/" % node in printed
                or "the model's copy is /var/lib/llama-box/node%d/" % node in printed), printed[-2000:]
        assert "/models/model.gguf" in host.file("/proc/%d/maps" % pid).content_string


def test_an_oversized_container_interleaves_its_pages_over_both_nodes(host):
    unit, port = BIG
    wait_active(host, [unit])
    assert (plan_of(host, unit)["policy"], plan_of(host, unit)["mem_nodes"]) == ("interleave", [0, 1])
    where = placement(host, unit, container_server(host, unit, "python3"))
    assert "interleave:0-1" in where["policies"], where["policies"]
    assert share(where["anon"], 0) >= INTERLEAVED_MIN_SHARE and share(where["anon"], 1) >= INTERLEAVED_MIN_SHARE, where
    assert where["cpus"] == "0-3"


def test_the_audit_finds_a_containers_processes_and_fails_them_against_the_other_nodes_plan(host):
    unit = "llama-box@0.service"
    pid = container_server(host, unit, "llama-server")
    right = host.run("%s audit --unit %s --plan-file /etc/inferops-numa/llama-box@0.plan.json" % (NUMA_PIN, unit))
    assert right.rc == 0, right.stdout + right.stderr
    assert pid in [process["pid"] for process in json.loads(right.stdout)["processes"]]
    wrong = host.run("%s audit --unit %s --plan-file /etc/inferops-numa/llama-box@1.plan.json" % (NUMA_PIN, unit))
    assert wrong.rc == 1, wrong.stdout + wrong.stderr
    assert json.loads(wrong.stdout)["ok"] is False


def test_a_gated_change_of_a_container_service_restarts_one_instance_at_a_time_and_goes_back(host, tmp_path):
    """Each container squeezed onto one CPU with four threads, gated: the first restarts, measures slower, and the
    change goes back; the two are never down together. (The unbound baseline of a first deployment is numa-pin's
    and the gate's, unit-tested for containers in tests/unit/test_pinning_calls.py and run for llama in
    test_llama.py: one converge less here.)"""
    before = {unit: host.service(unit).systemd_properties["InvocationID"] for unit in BOXES}
    gates_before = gate_verdicts(host)
    start_poller(host, "box-poll.service", "/run/box-poll.log", (8130, 8131))
    try:
        (box,) = [entry for entry in container_entries() if entry["name"] == "llama-box"]
        command = ["4" if arg == "{threads}" else arg for arg in box["command"]]
        others = json.loads(run_vars())["inference_service_list"]
        converge("-e", services_vars(tmp_path, "squeezed", others + container_entries(
            ab_gate=GATE, reserve_cpus="1,3", command=command)))
    finally:
        polls = [seen for _time, *seen in read_polls(host, "box-poll.service", "/run/box-poll.log")]
    squeezed = verdicts_since(host, gates_before)
    assert squeezed["llama-box@0.service"]["kept"] is False, squeezed["llama-box@0.service"]
    assert ["0", "0"] not in polls, "both containers down at once"
    assert ["0", "1"] in polls, "the first container never restarted"
    assert host.service("llama-box@0.service").systemd_properties["InvocationID"] != before["llama-box@0.service"]
    for unit, (_port, node) in BOXES.items():
        assert placement(host, unit, container_server(host, unit, "llama-server"))["cpus"] == node_cpus(host, node)


# --- docker: the daemon starts the container, so only its cgroup cpuset binds it -------------------------------

DOCKER_UNIT = "box-docker@0.service"
DOCKER_PLAN = "/run/box-docker@0.plan.json"
DOCKER_RUN = ("docker run --rm --name box-docker-0 --network host --cidfile /run/inferops-numa-box-docker-0.cid "
              "--volume /usr/local/lib/inferops-lab:/usr/local/lib/inferops-lab:ro localhost/inferops-lab/standin:1 "
              "python3 /usr/local/lib/inferops-lab/weights_server.py --port 8134 --weights-mb 32")


def test_docker_binds_a_container_by_its_cgroup_cpuset_and_the_audit_finds_it_by_its_id(host):
    """dockerd (in the image, not started at boot) runs the stand-in image under numa-pin exec --container-runtime
    docker, as the role's unit does: the container's server, which the daemon starts outside the unit, is on node
    1's CPUs with its pages there (the lab's parser), numa-pin's audit finds it by the id file and passes it, and an
    interleaved plan is refused before docker is asked."""
    started = host.run("systemctl start docker.service && (podman save localhost/inferops-lab/standin:1 "
                       "| docker load -q)")
    assert started.rc == 0, started.stdout + started.stderr
    own = "--node 1 --gpus none --model-size 32M --memory-headroom 16M --container-runtime docker"
    try:
        planned = host.run("%s explain %s > %s" % (NUMA_PIN, own.replace(" --container-runtime docker", ""),
                                                   DOCKER_PLAN))
        assert planned.rc == 0, planned.stderr
        host.run("python3 -c %s" % shlex.quote(
            "import json; p = json.load(open(%r)); p['container'] = 'docker'; json.dump(p, open(%r, 'w'))"
            % (DOCKER_PLAN, DOCKER_PLAN)))
        unit = host.run("systemd-run --unit=%s -p Type=exec %s exec %s -- %s"
                        % (DOCKER_UNIT, NUMA_PIN, own, DOCKER_RUN))
        assert unit.rc == 0, unit.stderr
        wait_until(lambda: host.run("curl -sf -o /dev/null --max-time 10 http://127.0.0.1:8134/health").rc == 0,
                   READY_S, "the docker container's stand-in ready")
        pid = int(host.run("docker inspect --format '{{.State.Pid}}' box-docker-0").stdout.strip())
        where = placement(host, DOCKER_UNIT, pid)
        assert where["cpus"] == node_cpus(host, 1) and share(where["anon"], 1) >= 0.99, where
        audited = host.run("%s audit --unit %s --plan-file %s --pages anon" % (NUMA_PIN, DOCKER_UNIT, DOCKER_PLAN))
        assert audited.rc == 0, audited.stdout + audited.stderr
        assert pid in [process["pid"] for process in json.loads(audited.stdout)["processes"]]
        refused = host.run("%s exec --node 0 --gpus none --policy interleave --container-runtime docker -- %s"
                           % (NUMA_PIN, DOCKER_RUN.replace("box-docker-0", "box-docker-refused")))
        assert refused.rc == 2 and "container runtime docker applies only a cgroup cpuset" in refused.stderr, \
            refused.stderr
    finally:
        host.run("systemctl stop %s; docker rm --force box-docker-0; rm -f %s /run/inferops-numa-box-docker-0.cid; "
                 "systemctl reset-failed %s; systemctl stop docker.socket docker.service containerd.service"
                 % (DOCKER_UNIT, DOCKER_PLAN, DOCKER_UNIT))
