"""Properties of the planner over generated topologies and requests.

Topologies: 1-16 nodes with sparse ids, CPU-less and memory-less nodes, SMT or
not, random symmetric SLIT (10 on the diagonal), random free memory, cpusets,
GPUs (some on CPU-less nodes or without a node) and interleave weights.
"""
import os
import random

from hypothesis import HealthCheck, assume, event, given, settings, strategies as st

from tests.unit import topo_factory as tf
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.cpulist import format_cpulist, parse_cpulist
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.placement import (
    PlacementError, Request, plan, plan_instances)

GIB = tf.GIB
# Inputs are built to reach each property's assertion: every topology has a usable node (CPUs and
# memory, inside the cpuset and mems), and a property about plans draws a request valid on it
# (requests(valid=True)). The few examples the planner still refuses are filtered out of those
# properties; event() labels say, per example, whether the assertion was reached ("reached: ...")
# or why not ("not reached: ..."): pytest --hypothesis-show-statistics shows the fractions.
# make test (its phases set INFEROPS_NUMA_REQUIRE_TOOLS) draws the full count; `make unit` half of it, which reaches
# each assertion more often than the full count did before the strategies were built to reach it.
EXAMPLES = 200 if os.environ.get("INFEROPS_NUMA_REQUIRE_TOOLS") else 100
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@st.composite
def topologies(draw, gpu_home=False):
    """A topology with at least one usable node, its "home": CPUs and memory, inside any cpuset and mems.
    ``gpu_home``: a GPU on the home node too (besides the drawn ones)."""
    ids = sorted(draw(st.sets(st.integers(0, 255), min_size=1, max_size=16)))
    home = draw(st.sampled_from(ids))
    nodes, siblings, next_cpu = [], [], 0
    threads = draw(st.sampled_from([1, 2]))
    for node_id in ids:
        cpus = []
        cores = draw(st.sampled_from([2, 1, 3, 4] if node_id == home else [2, 1, 3, 4, 0, 2, 4]))  # 0: CPU-less
        for _ in range(cores):
            core = list(range(next_cpu, next_cpu + threads))
            next_cpu += threads
            siblings.append(core)
            cpus.extend(core)
        total = draw(st.integers(1, 64))
        nodes.append(tf.make_node(node_id, cpus, total_gib=total,
                                  available_gib=draw(st.integers(0, total * 4)) / 4,
                                  packages=[draw(st.integers(0, 2))] if cpus else [],
                                  has_memory=node_id == home or draw(st.sampled_from([True] * 7 + [False]))))
    distances = [[10] * len(ids) for _ in ids]
    for a in range(len(ids)):
        for b in range(a + 1, len(ids)):
            distances[a][b] = distances[b][a] = draw(st.integers(11, 254))
    online = [cpu for node in nodes for cpu in node["cpus"]]
    home_cpus = next(node["cpus"] for node in nodes if node["id"] == home)
    # Mostly unrestricted; a restricted cpuset or mems keeps part of the home node.
    allowed = draw(st.one_of(st.just(""), st.just(""), st.tuples(st.sets(st.sampled_from(online)),
                                                                  st.sets(st.sampled_from(home_cpus), min_size=1))))
    mems = draw(st.one_of(st.just(""), st.just(""), st.sets(st.sampled_from(ids))))
    gpus = [tf.make_gpu("0000:%02x:00.0" % bus, draw(st.sampled_from(ids + [None])),
                        vendor=draw(st.sampled_from(["nvidia", "nvidia", "amd", "other"])))
            for bus in sorted(draw(st.sets(st.integers(1, 255), max_size=4)))]
    if gpu_home:
        taken = {gpu["address"] for gpu in gpus}
        bus = draw(st.sampled_from([bus for bus in range(1, 256) if "0000:%02x:00.0" % bus not in taken]))
        gpus.append(tf.make_gpu("0000:%02x:00.0" % bus, home, vendor=draw(st.sampled_from(["nvidia", "amd"]))))
    weights = draw(st.one_of(st.none(), st.fixed_dictionaries({str(i): st.integers(1, 3) for i in ids})))
    return tf.make_topology(nodes, distances=distances, gpus=gpus,
                            allowed=allowed if isinstance(allowed, str) else format_cpulist(allowed[0] | allowed[1]),
                            mems_allowed=mems if isinstance(mems, str) else format_cpulist(mems | {home}),
                            siblings=siblings, weighted_interleave=weights)


@st.composite
def requests(draw, topology, valid=False, **fixed):
    """A request on ``topology``; ``valid``: one it can hold (an existing usable node or none, a GPU count
    the host has, a model no bigger than the usable nodes' free memory), drawn alike otherwise."""
    ids = [node["id"] for node in topology["nodes"]]
    online = [cpu for node in topology["nodes"] for cpu in node["cpus"]]
    addresses = [gpu["address"] for gpu in topology["gpus"]]
    instances = draw(st.integers(1, 4))
    reserve = fixed["reserve_cpus"] if "reserve_cpus" in fixed else (
        sorted(draw(st.sets(st.sampled_from(online), max_size=2))) if online else [])
    candidates = sorted(usable(topology, Request(reserve_cpus=reserve))) if valid else ids + [max(ids) + 1]
    counts = [count for count in (1, 2) if count <= len(addresses)] if valid else [1, 2]
    options = {
        "node": draw(st.one_of(st.none(), st.none(), st.none(), st.sampled_from(candidates))
                     if candidates else st.none()),
        "gpus": draw(st.one_of(st.sampled_from(["auto", "none"] + counts),
                               st.lists(st.sampled_from(addresses), min_size=1, max_size=2, unique=True) if addresses
                               else st.just("auto"))),
        "model_size": draw(st.one_of(st.none(), st.integers(0, free_bytes(topology, candidates if valid else ids)))),
        "memory_headroom": draw(st.sampled_from(["0", "10%+1G", "2G", "25%"])),
        "smt": draw(st.booleans()),
        "reserve_cpus": reserve,
        "scope": draw(st.sampled_from(["node", "socket"])),
        "instances": instances,
        "instance": draw(st.integers(0, instances - 1)),
        "policy": draw(st.sampled_from(["auto", "auto", "bind", "preferred", "interleave"])),
        "on_unfit": draw(st.sampled_from(["interleave", "fail"])),
        "port_base": draw(st.sampled_from([None, 8080])),
    }
    options.update(fixed)
    return Request(**options)


def largest_model(options, room):
    """The largest model_size whose required bytes (model + options' headroom) fit in ``room``; None if none."""
    if Request(**dict(options, model_size=0)).required_bytes() > room:
        return None
    low, high = 0, room
    while low < high:
        middle = (low + high + 1) // 2
        if Request(**dict(options, model_size=middle)).required_bytes() <= room:
            low = middle
        else:
            high = middle - 1
    return low


def plan_or_none(topology, request):
    """The plan, or None for a PlacementError; any other exception fails the test."""
    try:
        return plan(topology, request)
    except PlacementError as error:
        assert str(error)
        return None


def drawn_plan_on(data, topology, **request_options):
    request = data.draw(requests(topology, valid=True, **request_options))
    result = plan_or_none(topology, request)
    event("not reached: the planner refused the request" if result is None else "planned")
    assume(result is not None)
    return topology, request, result


def drawn_plan(data, **request_options):
    """A drawn topology, a valid request drawn on it and its plan; the few examples the planner still
    refuses are skipped."""
    topology = data.draw(topologies())
    request = data.draw(requests(topology, valid=True, **request_options))
    result = plan_or_none(topology, request)
    event("not reached: the planner refused the request" if result is None else "planned")
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
    event("reached: every CPU, node and variable checked")


@SETTINGS
@given(st.data())
def test_bind_only_when_it_fits_and_interleave_only_over_a_fitting_set(data):
    # A model size always (the property is about sizes); policies auto, bind and interleave end in a policy
    # with nodes that must hold the model, preferred (1 in 5 requests, and an unfit auto) need not.
    topology = data.draw(topologies())
    size = data.draw(st.integers(0, free_bytes(topology, list(usable(topology, Request())))))
    _topology, _request, result = drawn_plan_on(data, topology, model_size=size)
    assert result.required_bytes is not None
    event("reached: %s fits its nodes" % result.policy if result.policy != "preferred"
          else "not reached: preferred need not fit")
    if result.policy in ("bind", "interleave", "weighted-interleave"):
        assert result.required_bytes <= result.available_bytes
    if result.policy == "weighted-interleave":
        weights = topology["kernel"]["weighted_interleave"]
        assert len({weights[str(node)] for node in result.mem_nodes}) > 1


@SETTINGS
@given(st.data())
def test_interleave_sets_are_the_shortest_run_that_fits_own_package_first_then_nearest(data):
    topology = data.draw(topologies())
    request = data.draw(requests(topology, valid=True, instances=1, instance=0, model_size=0,
                                 policy=data.draw(st.sampled_from(["auto", "bind", "interleave"])),
                                 on_unfit="interleave"))
    candidates = usable(topology, request)
    if not candidates:  # the drawn reservation took every CPU of the usable nodes
        event("not reached: no usable node left")
    assume(candidates)
    biggest = max(free_bytes(topology, [node]) for node in candidates)
    everything = free_bytes(topology, list(candidates))
    # A model too big for any one usable node (with its headroom) that all of them together hold.
    fits_all = largest_model(request.to_dict(), everything)
    fits_one = largest_model(request.to_dict(), biggest)
    low = 0 if fits_one is None else fits_one + 1
    if fits_all is None or low > fits_all:  # nodes too small for even the headroom, or a single usable node
        event("not reached: no size is too big for one usable node yet fits them all")
        assume(False)
    request = Request(**dict(request.to_dict(), model_size=data.draw(st.integers(low, fits_all))))
    result = plan_or_none(topology, request)
    if result is None or result.policy not in ("interleave", "weighted-interleave"):
        event("not reached: %s" % ("refused" if result is None else "planned " + result.policy))
    assume(result is not None and result.policy in ("interleave", "weighted-interleave"))
    assert result.required_bytes is not None
    event("reached: interleave over %d of %d usable nodes" % (len(result.mem_nodes), len(candidates)))
    candidates = usable(topology, request)
    base = base_nodes(topology, request, result, candidates)
    chosen = set(result.mem_nodes)
    extra = chosen - base
    assert base <= chosen
    packages = {node["id"]: set(node["packages"]) for node in topology["nodes"]}
    rank = {node: (not packages[node] & packages[result.node], distance(topology, result.node, node), node)
            for node in candidates}
    # The anchor's package first, then distance-ordered: nothing left out is nearer (in the anchor's package, or
    # by SLIT among the same) than something taken.
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
    request = data.draw(requests(topology, valid=True, instances=1, instance=0, policy="auto", scope="node",
                                 gpus=data.draw(st.sampled_from(["auto", "none"]))))
    candidates = usable(topology, request)
    if not candidates:  # the drawn reservation took every CPU of the usable nodes
        event("not reached: no usable node left")
    assume(candidates)
    # A usable node and a model (with its headroom) that fits it: the case the property is about.
    node = data.draw(st.sampled_from(sorted(candidates)))
    options = dict(request.to_dict(), node=node, model_size=0)
    if largest_model(options, free_bytes(topology, [node])) is None:  # less free than the headroom alone
        options["memory_headroom"] = "0"
    request = Request(**dict(options, model_size=data.draw(st.integers(
        0, largest_model(options, free_bytes(topology, [node]))))))
    required = request.required_bytes()
    assert request.node in candidates and required is not None and free_bytes(topology, [request.node]) >= required
    result = plan_or_none(topology, request)
    event("reached: a fitting model on a chosen node")
    assert result is not None and (result.policy, result.mem_nodes) == ("bind", [request.node])


@SETTINGS
@given(st.data())
def test_the_gpu_local_node_is_chosen_when_it_fits(data):
    topology = data.draw(topologies(gpu_home=True))
    reachable = usable(topology, Request())
    local = [gpu for gpu in topology["gpus"] if gpu["numa_node"] in reachable]  # the home GPU at least
    gpu = data.draw(st.sampled_from(local))
    elsewhere = [cpu for node in topology["nodes"] if node["id"] != gpu["numa_node"] for cpu in node["cpus"]]
    reserve = sorted(data.draw(st.sets(st.sampled_from(elsewhere), max_size=2))) if elsewhere else []
    request = data.draw(requests(topology, node=None, gpus=[gpu["address"]], instances=1, instance=0,
                                 policy="auto", scope="node", reserve_cpus=reserve, model_size=0))
    options = request.to_dict()
    room = free_bytes(topology, [gpu["numa_node"]])
    if largest_model(options, room) is None:
        options["memory_headroom"] = "0"
    size = data.draw(st.one_of(st.none(), st.integers(0, largest_model(options, room))))
    request = Request(**dict(options, model_size=size))
    candidates = usable(topology, request)
    assert gpu["numa_node"] in candidates
    required = request.required_bytes()
    assert required is None or free_bytes(topology, [gpu["numa_node"]]) >= required
    event("reached: a GPU on a usable node and a model that fits it")
    result = plan(topology, request)
    assert (result.node, result.policy, result.mem_nodes) == (gpu["numa_node"], "bind", [gpu["numa_node"]])
    assert result.gpus == [gpu["address"]]


@SETTINGS
@given(st.data())
def test_smt_off_hands_out_one_cpu_per_core(data):
    topology, _request, result = drawn_plan(data, smt=False)
    core_of = {cpu: tuple(group) for group in topology["cpus"]["siblings"] for cpu in group}
    cores = [core_of[cpu] for cpu in result.cpus]
    event("reached: one CPU per core checked")
    assert len(cores) == len(set(cores))


@SETTINGS
@given(st.data())
def test_cores_fast_hands_out_only_each_nodes_fastest_usable_kind(data):
    topology = data.draw(topologies())
    online = sorted(cpu for node in topology["nodes"] for cpu in node["cpus"])
    rank_of = {cpu: data.draw(st.sampled_from([0, 1, 2, None])) for cpu in online}  # None: a CPU of no kind
    ranks = sorted({rank for rank in rank_of.values() if rank is not None})
    topology["cpus"]["kinds"] = [{"cpulist": format_cpulist([cpu for cpu in online if rank_of[cpu] == rank]),
                                  "rank": rank} for rank in ranks] if len(ranks) > 1 else []
    _topology, request, result = drawn_plan_on(data, topology, cores="fast")
    allowed = set(parse_cpulist(topology["cpus"]["allowed"])) or set(online)
    for node in topology["nodes"]:
        mine = set(node["cpus"]) & allowed - set(request.reserve_cpus)
        known = [rank_of[cpu] for cpu in mine if rank_of[cpu] is not None]
        if len(ranks) < 2 or not known:
            continue
        handed = mine & set(result.cpus)
        event("reached: a node's fast cores checked" if handed else "not reached: the plan has no CPU on this node")
        assert all(rank_of[cpu] in (None, min(known)) for cpu in handed), (node["id"], handed, rank_of)


@SETTINGS
@given(st.data())
def test_instances_split_cpus_unless_a_node_is_too_small(data):
    topology = data.draw(topologies())
    # Several instances, mostly more than the cores of a usable node they are pinned to: a node too small
    # for its share, the case the property is about; else 2-8 instances placed as the planner likes.
    home = sorted(usable(topology, Request()))
    node = data.draw(st.one_of(st.none(), st.sampled_from(home), st.sampled_from(home)))
    cores = len({tuple(group) for group in topology["cpus"]["siblings"] for cpu in group
                 if node is not None and cpu in next(n["cpus"] for n in topology["nodes"] if n["id"] == node)})
    instances = data.draw(st.integers(2, 8) if node is None else st.integers(cores + 1, cores + 3))
    pinned = {} if node is None else {"reserve_cpus": [], "model_size": None}  # nothing else to refuse it for
    request = data.draw(requests(topology, valid=True, instances=instances, instance=0, node=node, **pinned))
    options = request.to_dict()
    plans = [plan_or_none(topology, Request(**dict(options, instance=index))) for index in range(request.instances)]
    placed = [result for result in plans if result is not None]
    pairs = [(first, second) for first in placed for second in placed if first.instance < second.instance]
    shared = [(first, second) for first, second in pairs if set(first.cpus) & set(second.cpus)]
    event("reached: instances sharing CPUs" if shared else "not reached: %s" % (
        "every pair of instances on disjoint CPUs" if pairs else "fewer than two instances placed"))
    for first, second in shared:
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
    event("reached: the same plan compared" if first is not None else "reached: the same refusal")
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
    from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
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
    event("reached: gpu_map checked%s" % (", a spanning instance" if span else ""))
    if span:
        assert span <= set(result.cpu_nodes)
        assert len(result.mem_nodes) > 1 or result.policy == "preferred"


@settings(max_examples=EXAMPLES * 3 // 4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
