"""Properties of the planner over generated topologies and requests.

Topologies: 1-16 nodes with sparse ids, CPU-less and memory-less nodes, SMT or
not, random symmetric SLIT (10 on the diagonal), random free memory, cpusets,
GPUs (some on CPU-less nodes or without a node) and interleave weights.
"""
import random

from hypothesis import HealthCheck, assume, given, settings, strategies as st

from tests.unit import topo_factory as tf
from ansible_collections.inferops.numa.plugins.module_utils.numa.cpulist import format_cpulist, parse_cpulist
from ansible_collections.inferops.numa.plugins.module_utils.numa.placement import (PlacementError, Request, plan,
                                                                               plan_instances)

GIB = tf.GIB
# Some requests are impossible by construction (a GPU count the host lacks, a cpuset that
# excludes every node); those raise PlacementError and are filtered out of the properties.
SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@st.composite
def topologies(draw):
    ids = sorted(draw(st.sets(st.integers(0, 255), min_size=1, max_size=16)))
    nodes, siblings, next_cpu = [], [], 0
    threads = draw(st.sampled_from([1, 2]))
    for node_id in ids:
        cpus = []
        for _ in range(draw(st.sampled_from([2, 1, 3, 4, 0, 2, 4]))):  # 0: a CPU-less node
            core = list(range(next_cpu, next_cpu + threads))
            next_cpu += threads
            siblings.append(core)
            cpus.extend(core)
        total = draw(st.integers(1, 64))
        nodes.append(tf.make_node(node_id, cpus, total_gib=total,
                                  available_gib=draw(st.integers(0, total * 4)) / 4,
                                  packages=[draw(st.integers(0, 2))] if cpus else [],
                                  has_memory=draw(st.sampled_from([True] * 7 + [False]))))
    distances = [[10] * len(ids) for _ in ids]
    for a in range(len(ids)):
        for b in range(a + 1, len(ids)):
            distances[a][b] = distances[b][a] = draw(st.integers(11, 254))
    online = [cpu for node in nodes for cpu in node["cpus"]]
    # Mostly unrestricted: a random cpuset rarely leaves a node usable.
    allowed = draw(st.one_of(st.just(""), st.just(""), st.sets(st.sampled_from(online), min_size=1)
                             if online else st.just("")))
    mems = draw(st.one_of(st.just(""), st.just(""), st.sets(st.sampled_from(ids), min_size=1)))
    gpus = [tf.make_gpu("0000:%02x:00.0" % bus, draw(st.sampled_from(ids + [None])),
                        vendor=draw(st.sampled_from(["nvidia", "nvidia", "amd", "other"])))
            for bus in sorted(draw(st.sets(st.integers(1, 255), max_size=4)))]
    weights = draw(st.one_of(st.none(), st.fixed_dictionaries({str(i): st.integers(1, 3) for i in ids})))
    return tf.make_topology(nodes, distances=distances, gpus=gpus,
                            allowed=allowed if isinstance(allowed, str) else format_cpulist(allowed),
                            mems_allowed=mems if isinstance(mems, str) else format_cpulist(mems),
                            siblings=siblings, weighted_interleave=weights)


@st.composite
def requests(draw, topology, **fixed):
    ids = [node["id"] for node in topology["nodes"]]
    online = [cpu for node in topology["nodes"] for cpu in node["cpus"]]
    addresses = [gpu["address"] for gpu in topology["gpus"]]
    instances = draw(st.integers(1, 4))
    options = {
        "node": draw(st.one_of(st.none(), st.none(), st.none(), st.sampled_from(ids + [max(ids) + 1]))),
        "gpus": draw(st.one_of(st.sampled_from(["auto", "none", 1, 2]),
                               st.lists(st.sampled_from(addresses), min_size=1, max_size=2, unique=True) if addresses
                               else st.just("auto"))),
        "model_size": draw(st.one_of(st.none(), st.integers(0, free_bytes(topology, ids)))),
        "memory_headroom": draw(st.sampled_from(["0", "10%+1G", "2G", "25%"])),
        "smt": draw(st.booleans()),
        "reserve_cpus": sorted(draw(st.sets(st.sampled_from(online), max_size=2))) if online else [],
        "scope": draw(st.sampled_from(["node", "socket"])),
        "instances": instances,
        "instance": draw(st.integers(0, instances - 1)),
        "policy": draw(st.sampled_from(["auto", "auto", "bind", "preferred", "interleave"])),
        "on_unfit": draw(st.sampled_from(["interleave", "fail"])),
        "port_base": draw(st.sampled_from([None, 8080])),
    }
    options.update(fixed)
    return Request(**options)


def plan_or_none(topology, request):
    """The plan, or None for a PlacementError; any other exception fails the test."""
    try:
        return plan(topology, request)
    except PlacementError as error:
        assert str(error)
        return None


def drawn_plan(data, **request_options):
    """A drawn topology, a drawn request on it and its plan; examples the planner refuses are skipped."""
    topology = data.draw(topologies())
    request = data.draw(requests(topology, **request_options))
    result = plan_or_none(topology, request)
    assume(result is not None)
    return topology, request, result


# ---------------------------------------------------------------- oracles ---

def usable(topology, request):
    """node id -> usable cpus, computed independently of the planner."""
    online = set(cpu for node in topology["nodes"] for cpu in node["cpus"])
    allowed = set(parse_cpulist(topology["cpus"]["allowed"])) or online
    mems = topology["cpus"]["mems_allowed"]
    mems_allowed = set(parse_cpulist(mems)) if mems else None
    result = {}
    for node in topology["nodes"]:
        cpus = set(node["cpus"]) & allowed - set(request.reserve_cpus)
        if cpus and node["has_memory"] and (mems_allowed is None or node["id"] in mems_allowed):
            result[node["id"]] = cpus
    return result


def free_bytes(topology, nodes):
    by_id = {node["id"]: node for node in topology["nodes"]}
    return sum(by_id[node]["memory_available_kb"] * 1024 for node in nodes)


def distance(topology, source, target):
    node = next(node for node in topology["nodes"] if node["id"] == source)
    return node["distances"][str(target)]


def spanned(request, result):
    """The nodes of the instance's GPUs when they are several and no node was fixed: it spans them."""
    nodes = {entry["node"] for entry in result.gpu_map}
    return nodes if len(nodes) > 1 and request.node is None and request.anchors is None else set()


def base_nodes(topology, request, result, candidates):
    """The nodes an instance occupies at least: its anchor (or its GPUs' nodes), or their packages."""
    seeds = spanned(request, result) or {result.node}
    if request.scope == "node":
        return seeds
    packages = {node["id"]: set(node["packages"]) for node in topology["nodes"]}
    return {node for node in candidates if any(packages[node] & packages[seed] for seed in seeds)}


# ------------------------------------------------------------- properties ---

@SETTINGS
@given(st.data())
def test_every_plan_respects_cpusets_reservations_and_node_sets(data):
    topology, request, result = drawn_plan(data)
    candidates = usable(topology, request)
    cpu_owner = {cpu: node["id"] for node in topology["nodes"] for cpu in node["cpus"]}
    assert result.cpus and result.cpus == sorted(set(result.cpus))
    assert all(cpu in candidates.get(cpu_owner[cpu], ()) for cpu in result.cpus)
    assert {cpu_owner[cpu] for cpu in result.cpus} <= set(result.cpu_nodes)
    assert set(result.cpu_nodes) <= set(candidates)
    assert set(result.mem_nodes) <= set(candidates)  # CPU-less and memory-less nodes never enter
    assert result.node in result.mem_nodes and result.node in result.cpu_nodes
    if result.policy != "preferred":
        assert set(result.cpu_nodes) <= set(result.mem_nodes)
    assert result.threads == len(result.cpus) == int(result.env["OMP_NUM_THREADS"])
    assert result.port == (None if request.port_base is None else request.port_base + request.instance)
    if request.node is not None:
        assert result.node == request.node


@SETTINGS
@given(st.data())
def test_bind_only_when_it_fits_and_interleave_only_over_a_fitting_set(data):
    topology, _request, result = drawn_plan(data)
    assume(result.required_bytes is not None)
    if result.policy in ("bind", "interleave", "weighted-interleave"):
        assert result.required_bytes <= result.available_bytes
    if result.policy == "weighted-interleave":
        weights = topology["kernel"]["weighted_interleave"]
        assert len({weights[str(node)] for node in result.mem_nodes}) > 1


@SETTINGS
@given(st.data())
def test_interleave_sets_are_the_shortest_nearest_first_run_that_fits(data):
    topology = data.draw(topologies())
    sizes = [free_bytes(topology, [node["id"]]) for node in topology["nodes"] if node["cpus"]]
    assume(sizes)
    # Between half the biggest node and everything: mostly too big for one node.
    model_size = data.draw(st.integers(max(sizes) // 2, sum(sizes)))
    request = data.draw(requests(topology, instances=1, instance=0, model_size=model_size,
                                 policy=data.draw(st.sampled_from(["auto", "bind", "interleave"])),
                                 on_unfit="interleave"))
    result = plan_or_none(topology, request)
    assume(result is not None and result.required_bytes is not None)
    assume(result.policy in ("interleave", "weighted-interleave"))
    candidates = usable(topology, request)
    base = base_nodes(topology, request, result, candidates)
    chosen = set(result.mem_nodes)
    extra = chosen - base
    assert base <= chosen
    rank = {node: (distance(topology, result.node, node), node) for node in candidates}
    # Distance-ordered: nothing left out is nearer to the anchor than something taken.
    outside = set(candidates) - chosen
    if extra and outside:
        assert max(rank[node] for node in extra) < min(rank[node] for node in outside)
    # Minimal: without its farthest extra node the set would not fit.
    if extra:
        farthest = max(extra, key=lambda node: rank[node])
        assert free_bytes(topology, chosen - {farthest}) < result.required_bytes
    elif request.policy != "interleave" and not spanned(request, result):
        # Only a spanning instance interleaves what fits its base (it is never bound to one node).
        assert free_bytes(topology, base) < result.required_bytes


@SETTINGS
@given(st.data())
def test_fitting_models_are_never_interleaved_or_refused_under_auto(data):
    topology = data.draw(topologies())
    # A GPU count can be impossible on its own; "auto" and "none" never are.
    request = data.draw(requests(topology, instances=1, instance=0, policy="auto", scope="node",
                                 gpus=data.draw(st.sampled_from(["auto", "none"]))))
    result = plan_or_none(topology, request)
    candidates = usable(topology, request)
    required = request.required_bytes()
    if request.node is not None and request.node in candidates and required is not None \
            and free_bytes(topology, [request.node]) >= required:
        assert result is not None and (result.policy, result.mem_nodes) == ("bind", [request.node])


@SETTINGS
@given(st.data())
def test_the_gpu_local_node_is_chosen_when_it_fits(data):
    topology = data.draw(topologies())
    local = [gpu for gpu in topology["gpus"] if gpu["numa_node"] is not None]
    assume(local)
    gpu = data.draw(st.sampled_from(local))
    request = data.draw(requests(topology, node=None, gpus=[gpu["address"]], instances=1, instance=0,
                                 policy="auto", scope="node"))
    candidates = usable(topology, request)
    assume(gpu["numa_node"] in candidates)
    required = request.required_bytes()
    assume(required is None or free_bytes(topology, [gpu["numa_node"]]) >= required)
    result = plan(topology, request)
    assert (result.node, result.policy, result.mem_nodes) == (gpu["numa_node"], "bind", [gpu["numa_node"]])
    assert result.gpus == [gpu["address"]]


@SETTINGS
@given(st.data())
def test_smt_off_hands_out_one_cpu_per_core(data):
    topology, _request, result = drawn_plan(data, smt=False)
    core_of = {cpu: tuple(group) for group in topology["cpus"]["siblings"] for cpu in group}
    cores = [core_of[cpu] for cpu in result.cpus]
    assert len(cores) == len(set(cores))


@SETTINGS
@given(st.data())
def test_instances_split_cpus_unless_a_node_is_too_small(data):
    topology = data.draw(topologies())
    request = data.draw(requests(topology))
    options = request.to_dict()
    plans = [plan_or_none(topology, Request(**dict(options, instance=index))) for index in range(request.instances)]
    placed = [result for result in plans if result is not None]
    for first in placed:
        for second in placed:
            if first.instance < second.instance and set(first.cpus) & set(second.cpus):
                assert any("share all of them" in reason for reason in first.reasons + second.reasons)


@SETTINGS
@given(st.data())
def test_same_input_same_plan_in_any_order(data):
    topology = data.draw(topologies())
    request = data.draw(requests(topology))
    first = plan_or_none(topology, request)
    shuffled = dict(topology, nodes=list(topology["nodes"]), gpus=list(topology["gpus"]), distances=[])
    rng = random.Random(data.draw(st.integers(0, 1000)))
    rng.shuffle(shuffled["nodes"])
    rng.shuffle(shuffled["gpus"])
    second = plan_or_none(shuffled, request)
    assert (first is None) == (second is None)
    if first is not None:
        assert first.to_dict() == second.to_dict()
        assert plan(topology, request).to_dict() == first.to_dict()


@SETTINGS
@given(st.dictionaries(st.sampled_from(["node", "gpus", "model_size", "memory_headroom", "smt", "reserve_cpus",
                                        "scope", "instances", "instance", "policy", "on_unfit", "port_base",
                                        "typo"]),
                       st.one_of(st.none(), st.booleans(), st.integers(-3, 70000), st.text(max_size=8),
                                 st.lists(st.integers(-1, 3), max_size=3), st.floats(allow_nan=True))))
def test_from_options_either_builds_a_request_or_raises_numa_error(options):
    from ansible_collections.inferops.numa.plugins.module_utils.numa.errors import NumaError
    try:
        request = Request.from_options(options)
    except NumaError as error:
        assert str(error)
        return
    assert 0 <= request.instance < request.instances


@SETTINGS
@given(st.data())
def test_a_spanning_instance_covers_its_gpus_nodes_and_maps_every_worker_inside_the_plan(data):
    topology, request, result = drawn_plan(data)
    assert [entry["gpu"] for entry in result.gpu_map] == result.gpus
    for entry in result.gpu_map:
        assert set(parse_cpulist(entry["cpulist"])) <= set(result.cpus)
        assert entry["mem_nodes"] and set(entry["mem_nodes"]) <= set(result.mem_nodes)
    span = spanned(request, result)
    if span:
        assert span <= set(result.cpu_nodes)
        assert len(result.mem_nodes) > 1 or result.policy == "preferred"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_planning_every_instance_at_once_is_planning_each_alone(data):
    topology = data.draw(topologies())
    request = data.draw(requests(topology, instance=0))
    together = plan_instances(topology, request)
    assert len(together) == request.instances
    for index, result in enumerate(together):
        try:
            alone = plan(topology, Request.from_options(dict(request.to_dict(), instance=index))).to_dict()
        except PlacementError as error:
            alone = str(error)
        assert (str(result) if isinstance(result, PlacementError) else result.to_dict()) == alone
