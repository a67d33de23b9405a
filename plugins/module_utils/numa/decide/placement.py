"""Decide where an inference server runs: a pure function of (topology, Request).

``plan(topology, request)`` takes the ``numa_facts`` dict (see topology.py) and a
``Request`` and returns a ``Plan``: memory policy and nodes, CPUs, GPUs,
environment, port, and ``reasons`` -- one sentence per decision and fallback. No
I/O happens here: a model given as a path is measured by ``sizes.size_of_path``
before planning.

Like kubelet's Topology Manager the work has two stages:

* hints -- what the hardware and the request allow: usable ("candidate") nodes
  after cpuset, mems_allowed and reserved CPUs; which node each GPU is local to;
  how much memory each node has left;
* policy -- what to do with them: pick the anchor node (explicit, GPU-local or
  best memory score), then bind / interleave / prefer memory, then hand out CPUs.

All instances 0..instances-1 of a service are simulated in order so that the
plan for instance i knows what the instances before it took (memory, nodes) and
which instances share its nodes (they split the CPUs of a shared node).
docs/placement.md states the rules for users.

numa-pin exec plans at every service start, so this module imports no more than it
runs there: plain classes instead of ``dataclasses`` (~10 ms with its ``inspect``),
exact integer arithmetic instead of ``fractions`` (which pulls in ``decimal`` and
``re``), string methods instead of ``re``, and ``typing`` for type checkers only.
"""
from __future__ import annotations

from ..base.cpulist import format_cpulist, is_kernel_number, parse_cpulist
from ..base.engines import nearest_rdma, recipe
from ..base.errors import NumaError, shown
from ..base.gpu_vendors import visibility_env
from ..inputs.request import Request, copied
from ..base.sizes import format_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Set, Tuple, Union

__all__ = ["PlacementError", "Plan", "plan", "plan_instances"]

# What the kernel assumes between two nodes when firmware gives no SLIT.
REMOTE_DISTANCE = 20
LOCAL_DISTANCE = 10
# An anchor's score weighs its free memory share 3/5 and its spread term 2/5, in fifths.
MEMORY_FIFTHS = 3
SPREAD_FIFTHS = 2


class PlacementError(NumaError):
    """The request cannot be placed on this topology; the message names sizes, nodes and the fix."""


class _Record:
    """A plain record: built from keyword arguments for exactly its ``__slots__``.

    What ``@dataclass`` gave the planner's internal types, without importing dataclasses.
    """

    __slots__ = ()

    def __init__(self, **fields: Any) -> None:
        if set(fields) != set(self.__slots__):
            raise TypeError("%s() takes exactly the fields %s" % (type(self).__name__, ", ".join(self.__slots__)))
        for name, value in fields.items():
            setattr(self, name, value)


# ------------------------------------------------------------------- plan ---

class Plan(_Record):
    """Where one instance runs. ``to_dict()`` is the JSON form every consumer uses.

    available_bytes is what mem_nodes had left after the instances simulated
    before this one (the figure the fit check used).
    """

    # In to_dict() order (then cpulist and threads).
    __slots__ = ("policy", "node", "mem_nodes", "cpu_nodes", "cpus", "gpus", "gpu_map", "engine", "env", "instance",
                 "instances", "port", "required_bytes", "available_bytes", "reasons", "inputs")
    policy: str
    node: int
    mem_nodes: List[int]
    cpu_nodes: List[int]
    cpus: List[int]
    gpus: List[str]
    gpu_map: List[Dict[str, Any]]
    engine: Dict[str, Any]
    env: Dict[str, str]
    instance: int
    instances: int
    port: Optional[int]
    required_bytes: Optional[int]
    available_bytes: int
    reasons: List[str]
    inputs: Dict[str, Any]

    @property
    def cpulist(self) -> str:
        return format_cpulist(self.cpus)

    @property
    def threads(self) -> int:
        return len(self.cpus)

    def to_dict(self) -> Dict[str, Any]:
        result = {name: copied(getattr(self, name)) for name in self.__slots__}
        result["cpulist"] = self.cpulist
        result["threads"] = self.threads
        return result

    def summary(self) -> str:
        """One line for logs: instance, policy, nodes, cpus, gpus."""
        return "instance %d/%d: %s memory on node(s) %s, cpus %s (%d threads)%s" % (
            self.instance, self.instances, self.policy, format_cpulist(self.mem_nodes),
            self.cpulist, self.threads, ", gpus " + ",".join(self.gpus) if self.gpus else "")


def plan(topology: Dict[str, Any], request: Request) -> Plan:
    """The placement of ``request.instance`` on ``topology``; raises PlacementError if impossible."""
    hints = _gather_hints(topology, request)
    _check_fits_host(hints, request)
    return _plan_with(hints, request, _simulate(hints, request))


def plan_instances(topology: Dict[str, Any], request: Request) -> List[Union[Plan, PlacementError]]:
    """plan() of every instance of ``request`` (0 to instances-1): each its Plan or the PlacementError
    plan() raises for it. The hints are read and the instances simulated once: neither depends on which
    instance is planned, and on a 64-node machine redoing them per instance was most of planning its 64."""
    try:
        hints = _gather_hints(topology, request)
        _check_fits_host(hints, request)
    except PlacementError as error:
        return [error] * request.instances
    outcomes = _simulate(hints, request)
    results = []  # type: List[Union[Plan, PlacementError]]
    for index in range(request.instances):
        try:
            results.append(_plan_with(hints, Request.from_options(dict(request.to_dict(), instance=index)),
                                      outcomes))
        except PlacementError as error:
            results.append(error)
    return results


def _plan_with(hints: _Hints, request: Request, outcomes: List[Union[_Placement, PlacementError]]) -> Plan:
    mine = outcomes[request.instance]
    if isinstance(mine, PlacementError):
        raise _for_instance(mine, request.instance, request.instances)
    placements = [None if isinstance(outcome, PlacementError) else outcome
                  for outcome in outcomes]  # type: List[Optional[_Placement]]
    notes = _simulation_notes(outcomes, request.instance)
    cpus, cpu_reasons = _assign_cpus(hints, placements, request.instance, request.smt)
    env, env_reasons = _environment(hints, mine.gpus, len(cpus))
    gpu_map, map_reasons = _gpu_map(hints, mine, cpus, request.smt)
    # Spanning: the instance covers several nodes because its GPUs do (not only for memory).
    engine = recipe(request.engine, gpu_map, len({entry["node"] for entry in gpu_map}) > 1
                    and len(mine.cpu_nodes) > 1)
    env.update(engine["env"])
    port = None if request.port_base is None else request.port_base + request.instance
    return Plan(
        policy=mine.policy, node=mine.anchor, mem_nodes=sorted(mine.mem_nodes),
        cpu_nodes=sorted(mine.cpu_nodes), cpus=cpus, gpus=[gpu["address"] for gpu in mine.gpus],
        gpu_map=gpu_map, engine=engine, env=env, instance=request.instance, instances=request.instances,
        port=port, required_bytes=request.required_bytes(), available_bytes=mine.available,
        reasons=hints.reasons + notes + mine.reasons + cpu_reasons + env_reasons + map_reasons
        + engine["reasons"], inputs=request.to_dict())


def _check_fits_host(hints: _Hints, request: Request) -> None:
    """What the request asks of this host, checked before the simulation loops over its instances."""
    usable = sum(len(node.cpus) for node in hints.candidates.values())
    if request.instances > usable:
        raise PlacementError("instances=%d but this host has %d usable CPU(s) (online, allowed by the cpuset, "
                             "not reserved): each instance needs one; lower instances or shrink reserve_cpus"
                             % (request.instances, usable))
    unknown = sorted(set(request.anchors or ()) - set(hints.node_ids))
    if unknown:
        raise PlacementError("anchors name node(s) %s, which this host does not have (node(s) %s): plan the "
                             "anchors on this host again" % (format_cpulist(unknown), format_cpulist(hints.node_ids)))


# ------------------------------------------------------------------ hints ---

class _Node(_Record):
    """A candidate node: usable CPUs (online, allowed, not reserved), the nodes whose memory serves
    them (itself, or for a node without memory the ones HMAT or SLIT name), and their bytes."""
    __slots__ = ("id", "cpus", "memory", "memory_from", "total", "packages")
    id: int
    cpus: Tuple[int, ...]
    memory: Tuple[int, ...]
    memory_from: Optional[str]           # facts' memory_from: local, hmat, slit
    total: int
    packages: Tuple[int, ...]


class _Hints(_Record):
    __slots__ = ("topology", "node_ids", "candidates", "near_memory", "far_memory", "available", "excluded",
                 "distances", "far", "core_of", "gpus", "nics", "reasons")
    topology: Dict[str, Any]
    node_ids: List[int]                  # every node of the topology, sorted
    candidates: Dict[int, _Node]         # usable nodes by id
    near_memory: Dict[int, Optional[int]]  # memory-only nodes at DRAM speed serving no candidate -> home package
    far_memory: Dict[int, Optional[int]]  # memory-only far nodes (CXL, PMEM) serving no candidate -> home package
    available: Dict[int, int]            # bytes available on each node serving a candidate's memory
    excluded: Dict[int, str]             # node id -> why it is not usable
    distances: Dict[Tuple[int, int], int]
    far: int                             # an unknown distance: the farthest known one
    core_of: Dict[int, Tuple[int, ...]]  # cpu -> its SMT sibling group
    gpus: List[Dict[str, Any]]           # every GPU the topology lists, PCI order
    nics: List[Dict[str, Any]]           # every NIC the topology lists
    reasons: List[str]

    def distance(self, source: int, target: int) -> int:
        return self.distances.get((source, target), LOCAL_DISTANCE if source == target else self.far)

    def nearest_first(self, anchor: int, nodes: List[int]) -> List[int]:
        """anchor first, then by SLIT distance from it, ties by lowest id."""
        return sorted(nodes, key=lambda node: (node != anchor, self.distance(anchor, node), node))

    def own_package_first(self, anchor: int, nodes: List[int]) -> List[int]:
        """``nodes`` sharing a package with the candidate ``anchor`` first, then the others, each nearest_first. A
        sub-NUMA socket (SNC, NPS) spills within itself first: SLIT alone can rank the other socket's sub-node
        nearer."""
        home = set(self.candidates[anchor].packages)
        nearest = self.nearest_first(anchor, nodes)
        return ([node for node in nearest if home & set(self.candidates[node].packages)]
                + [node for node in nearest if not home & set(self.candidates[node].packages)])

    def spill_order(self, anchor: int, base: List[int]) -> List[int]:
        """``base``, then the other candidates own_package_first, each memory-only node right after the last
        candidate of its home package, its near (DRAM-speed) nodes before its far ones, each nearest first: an
        instance that outgrows its DRAM takes its own socket's CPU-less DRAM, then its expander, before the other
        socket, and never such memory alone."""
        order = base + self.own_package_first(anchor, [node for node in self.candidates if node not in base])
        spilled = set()  # type: Set[int]
        for memory in (self.nearest_first(anchor, list(self.near_memory))
                       + self.nearest_first(anchor, list(self.far_memory))):
            package = self.near_memory[memory] if memory in self.near_memory else self.far_memory[memory]
            homes = [index for index, node in enumerate(order)
                     if node in self.candidates and package in self.candidates[node].packages]
            at = max(homes[-1] + 1, len(base)) if homes else len(order)
            while at < len(order) and order[at] in spilled:  # after the nodes spilled there before: nearer, faster
                at += 1
            order.insert(at, memory)
            spilled.add(memory)
        return order

    def cpu_nodes(self, nodes: List[int]) -> List[int]:
        return [node for node in nodes if node in self.candidates]

    def memory_of(self, nodes: List[int]) -> List[int]:
        """The memory nodes serving ``nodes`` (candidates, or far-memory nodes serving themselves), in their order,
        each once."""
        result = []  # type: List[int]
        for node in nodes:
            memory = self.candidates[node].memory if node in self.candidates else (node,)
            result.extend(serving for serving in memory if serving not in result)
        return result


def _gather_hints(topology: Dict[str, Any], request: Request) -> _Hints:
    nodes = _node_records(topology)
    cpus_info = topology.get("cpus") or {}
    online = sorted(set(cpu for node in nodes for cpu in node.get("cpus") or []))
    allowed = set(parse_cpulist(cpus_info.get("allowed") or "") or online)
    mems_text = cpus_info.get("mems_allowed") or ""
    mems_allowed = set(parse_cpulist(mems_text)) if mems_text else None
    reserved = set(request.reserve_cpus)
    slower, kind_reasons = (_slower_cpus(cpus_info, nodes, allowed - reserved) if request.cores == "fast"
                            else (set(), []))
    reserved |= slower
    by_id = {node["id"]: node for node in nodes}
    candidates = {}
    excluded = {}
    for node in nodes:
        usable = tuple(sorted(set(node.get("cpus") or []) & allowed - reserved))
        listed = _serving_memory(node, by_id)
        memory = tuple(serving for serving in listed if mems_allowed is None or serving in mems_allowed)
        why = _unusable(node, usable, allowed, listed, memory, mems_text, request.reserve_cpus)
        if why:
            excluded[node["id"]] = why
        else:
            candidates[node["id"]] = _Node(
                id=node["id"], cpus=usable, memory=memory, memory_from=node.get("memory_from"),
                total=sum(_kb_bytes(by_id[serving], "memory_total_kb") for serving in memory),
                packages=tuple(sorted(node.get("packages") or [])))
    near_memory = _spill_memory(nodes, candidates, mems_allowed, "near")
    far_memory = _spill_memory(nodes, candidates, mems_allowed, "far")
    available = {serving: _kb_bytes(by_id[serving], "memory_available_kb")
                 for serving in [memory for node in candidates.values() for memory in node.memory]
                 + list(near_memory) + list(far_memory)}
    distances = _distance_table(topology, nodes)
    hints = _Hints(topology=topology, node_ids=[node["id"] for node in nodes], candidates=candidates,
                   near_memory=near_memory, far_memory=far_memory, available=available, excluded=excluded,
                   distances=distances,
                   far=max(distances.values(), default=REMOTE_DISTANCE), core_of=_sibling_groups(cpus_info),
                   gpus=sorted(topology.get("gpus") or [], key=lambda gpu: gpu["address"]),
                   nics=list(topology.get("nics") or []),
                   reasons=_cpuset_reasons(online, allowed, request.reserve_cpus) + kind_reasons)
    hints.reasons.append(_candidate_reason(hints))
    if not candidates:
        raise PlacementError("no usable NUMA node: %s; widen the cpuset (allowed cpus/mems) or shrink "
                             "reserve_cpus" % _excluded_text(hints))
    return hints


def _node_records(topology: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The topology's nodes by id; a record without an integer id is a topology made by hand, refused."""
    nodes = topology.get("nodes") or []
    for node in nodes:
        if not isinstance(node, dict) or not _is_number(node.get("id")):
            raise PlacementError("topology node %s has no integer id: plan on the numa facts as numa_facts "
                                 "reads them" % shown(node))
    return sorted(nodes, key=lambda node: node["id"])


def _spill_memory(nodes: List[Dict[str, Any]], candidates: Dict[int, _Node], mems_allowed: Optional[set],
                  memory_class: str) -> Dict[int, Optional[int]]:
    """Memory-only nodes of ``memory_class`` (facts' ``near``: at the host's DRAM speed; ``far``: CXL, PMEM, memory
    without figures) that serve no candidate and the cpuset allows, with their home package: what an oversized
    instance spills to after its DRAM. A GPU's memory node is not one: no engine recipe asks for host allocations
    there."""
    serving = {memory for node in candidates.values() for memory in node.memory}
    return {node["id"]: node.get("home_package") for node in nodes
            if node.get("memory_class") == memory_class and node["id"] not in serving and node.get("has_memory")
            and (mems_allowed is None or node["id"] in mems_allowed)}


def _is_number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _serving_memory(node: Dict[str, Any], by_id: Dict[int, Dict[str, Any]]) -> Tuple[int, ...]:
    """The nodes whose memory the node's CPUs use: facts' memory_nodes; in a topology made by hand
    without them, the node itself unless it says it has no memory."""
    listed = node.get("memory_nodes")
    if not isinstance(listed, list):
        listed = [node["id"]] if node.get("has_memory", True) else []
    return tuple(serving for serving in listed if _is_number(serving) and serving in by_id)


def _kb_bytes(node: Dict[str, Any], field: str) -> int:
    value = node.get(field)
    return value * 1024 if _is_number(value) and value > 0 else 0


def _unusable(node: Dict[str, Any], usable: Tuple[int, ...], allowed: set, listed: Tuple[int, ...],
              memory: Tuple[int, ...], mems_text: str, reserved: List[int]) -> Optional[str]:
    """Why the node cannot be used, or None; ``listed``: the memory serving it, ``memory``: what the
    cpuset allows of that."""
    cpus = node.get("cpus") or []
    if not cpus:
        return "no CPUs (memory-only node)"
    if not listed:
        return "no memory, and no node's memory is known to serve it (CPU-only node)"
    if not memory and listed == (node["id"],):
        return "its memory is not allowed by the cpuset (mems_allowed %s)" % mems_text
    if not memory:
        return "the memory serving it (node(s) %s) is not allowed by the cpuset (mems_allowed %s)" % (
            format_cpulist(listed), mems_text)
    if not usable and not set(cpus) & allowed:
        return "its CPUs %s are not allowed by the cpuset (allowed %s)" % (
            format_cpulist(cpus), format_cpulist(allowed))
    if not usable:
        return "all its allowed CPUs are reserved (reserve_cpus %s)" % format_cpulist(reserved)
    return None


def _distance_table(topology: Dict[str, Any], nodes: List[Dict[str, Any]]) -> Dict[Tuple[int, int], int]:
    """SLIT as {(from, to): distance}: each node's own row, else the matrix in nodes order.

    An unknown distance (null: a node the kernel's online list left out) is no entry:
    _Hints.distance counts it as far as the farthest known one (the kernel's remote
    default, 20, when there are none).
    """
    table = {}
    matrix = topology.get("distances") or []
    for row_index, node in enumerate(nodes):
        row = matrix[row_index] if row_index < len(matrix) else []
        for column, other in enumerate(nodes):
            if column < len(row) and _is_number(row[column]):
                table[(node["id"], other["id"])] = row[column]
        for target, distance in (node.get("distances") or {}).items():
            if is_kernel_number(str(target)) and _is_number(distance):
                table[(node["id"], int(target))] = distance
    return table


def _slower_cpus(cpus_info: Dict[str, Any], nodes: List[Dict[str, Any]], usable: set) -> Tuple[set, List[str]]:
    """cores fast: the ``usable`` CPUs of each node that are of a slower kind than its fastest usable one (the
    facts' ``cpus.kinds``, rank 0 fastest; a CPU of no kind is not known to be slower and stays), and a reason per
    node that leaves some; none where every CPU is alike."""
    rank_of = _kind_ranks(cpus_info.get("kinds") or [])
    if not rank_of:
        return set(), ["cores fast: every CPU of this host is of one kind (the facts list no cpus.kinds): all of "
                       "them are used"]
    slower, reasons = set(), []
    for node in nodes:
        mine = sorted(set(node.get("cpus") or []) & usable)
        fastest = min((rank_of[cpu] for cpu in mine if cpu in rank_of), default=0)
        left = [cpu for cpu in mine if rank_of.get(cpu, fastest) > fastest]
        if left:
            slower.update(left)
            reasons.append("cores fast: node %s uses its fastest CPUs %s and leaves the slower %s" % (
                node["id"], format_cpulist(sorted(set(mine) - set(left))), format_cpulist(left)))
    return slower, reasons


def _kind_ranks(kinds: List[Any]) -> Dict[int, int]:
    """cpu -> the rank of its kind, from the facts' ``cpus.kinds``; PlacementError for a list numa_facts would not
    write."""
    ranks = {}
    for kind in kinds if isinstance(kinds, list) else [kinds]:
        listed, rank = (kind.get("cpulist"), kind.get("rank")) if isinstance(kind, dict) else (None, None)
        try:
            cpus = parse_cpulist(listed) if isinstance(listed, str) else None
        except NumaError:
            cpus = None
        if cpus is None or not _is_number(rank) or rank < 0:
            raise PlacementError("topology cpus.kinds entry %s has no cpulist and rank: plan on the numa facts as "
                                 "numa_facts reads them" % shown(kind))
        ranks.update((cpu, rank) for cpu in cpus)
    return ranks


def _sibling_groups(cpus_info: Dict[str, Any]) -> Dict[int, Tuple[int, ...]]:
    groups = {}
    for group in cpus_info.get("siblings") or []:
        ordered = tuple(sorted(group))
        for cpu in ordered:
            groups[cpu] = ordered
    return groups


def _cpuset_reasons(online: List[int], allowed: set, reserved: List[int]) -> List[str]:
    reasons = []
    if not set(online) <= allowed:
        reasons.append("cpuset allows cpus %s of online %s" % (
            format_cpulist(allowed & set(online)), format_cpulist(online)))
    if reserved:
        reasons.append("reserved cpus %s are never handed out" % format_cpulist(reserved))
    return reasons


def _candidate_reason(hints: _Hints) -> str:
    text = "usable nodes: %s" % (format_cpulist(hints.candidates) or "none")
    if hints.excluded:
        text += " (%s)" % _excluded_text(hints)
    return text


def _excluded_text(hints: _Hints) -> str:
    """Unusable nodes grouped by reason: "nodes 1-8: no CPUs (memory-only node)"."""
    by_reason = {}
    for node, why in sorted(hints.excluded.items()):
        by_reason.setdefault(why, []).append(node)
    return "; ".join("%s: %s" % (_nodes_text(nodes), why) for why, nodes in by_reason.items())


# ------------------------------------------------------------- simulation ---

class _Placement(_Record):
    __slots__ = ("anchor", "policy", "mem_nodes", "cpu_nodes", "gpus", "available", "reasons")
    anchor: int
    policy: str
    mem_nodes: List[int]
    cpu_nodes: List[int]
    gpus: List[Dict[str, Any]]
    available: int
    reasons: List[str]


class _State(_Record):
    """What the instances simulated so far left: free bytes per memory node, instance count per node."""
    __slots__ = ("free", "load")
    free: Dict[int, int]
    load: Dict[int, int]

    def take(self, placement: _Placement, required: Optional[int]) -> None:
        for node in placement.cpu_nodes:
            self.load[node] += 1
        if not required:
            return
        # Spread the instance over its memory nodes in proportion to what each had.
        pool = sum(self.free[node] for node in placement.mem_nodes)
        for node in placement.mem_nodes:
            share = required * self.free[node] // pool if pool else 0
            self.free[node] = max(0, self.free[node] - share)


def _simulate(hints: _Hints, request: Request) -> List[Union[_Placement, PlacementError]]:
    """Every instance placed in order: its placement, or the PlacementError that left it out.

    An instance that cannot be placed is left out of the others' simulation (it fails on its own plan), so
    that each instance's plan stands on its own merits, and the outcomes are the same whichever instance
    is planned.
    """
    state = _State(free=dict(hints.available), load={node: 0 for node in hints.candidates})
    outcomes = []  # type: List[Union[_Placement, PlacementError]]
    required = request.required_bytes()
    for index in range(request.instances):
        try:
            placement = _place_instance(hints, request, index, state)
        except PlacementError as error:
            outcomes.append(error)
            continue
        outcomes.append(placement)
        state.take(placement, required)
    return outcomes


def _simulation_notes(outcomes: List[Union[_Placement, PlacementError]], instance: int) -> List[str]:
    """What instance ``instance``'s plan says of the others: those left out, and those placed before it."""
    notes = []
    for index, outcome in enumerate(outcomes):
        if index == instance:
            continue
        if isinstance(outcome, PlacementError):
            notes.append("instance %d cannot be placed (%s): left out of this plan's simulation" % (index, outcome))
        elif index < instance:
            notes.append("instance %d placed before this one: %s on node(s) %s" % (
                index, outcome.policy, format_cpulist(outcome.mem_nodes)))
    return notes


def _for_instance(error: PlacementError, index: int, instances: int) -> PlacementError:
    if instances == 1:
        return error
    return PlacementError("instance %d of %d: %s" % (index, instances, error))


def _place_instance(hints: _Hints, request: Request, index: int, state: _State) -> _Placement:
    gpus, reasons = _gpus_for_instance(hints, request, index)
    span = _spanned_nodes(hints, request, gpus)
    if span:
        anchor, anchor_reasons = _gpu_anchor(hints, gpus)
        base = _span_base(hints, request, anchor, span)
        memory = _place_memory(hints, request, anchor, state, base)
        anchor_reasons.append(_span_reason(hints, gpus, base))
    else:
        anchor, anchor_reasons = _choose_anchor(hints, request, gpus, state, index)
        memory = _place_memory(hints, request, anchor, state)
    memory.gpus = gpus
    memory.reasons = reasons + anchor_reasons + memory.reasons
    return memory


def _spanned_nodes(hints: _Hints, request: Request, gpus: List[Dict[str, Any]]) -> List[int]:
    """The usable nodes local to the instance's GPUs when there are several (none else): the
    instance spans them. A node the request fixes (node, anchors) overrides GPU locality."""
    if request.node is not None or request.anchors is not None:
        return []
    nodes = sorted({node for node in (_gpu_node(hints, gpu)[0] for gpu in gpus) if node is not None})
    return nodes if len(nodes) > 1 else []


def _span_base(hints: _Hints, request: Request, anchor: int, span: List[int]) -> List[int]:
    """The nodes a spanning instance occupies at least: its GPUs' nodes, or their whole packages."""
    nodes = set(span)
    if request.scope == "socket":
        nodes.update(member for node in span for member in _package_nodes(hints, node))
    return hints.nearest_first(anchor, sorted(nodes))


def _span_reason(hints: _Hints, gpus: List[Dict[str, Any]], base: List[int]) -> str:
    local = ", ".join("%s on node %s" % (gpu["address"], _gpu_node(hints, gpu)[0]) for gpu in gpus)
    return ("the instance's GPUs span nodes %s (%s): the process gets the CPUs and memory of all of them, "
            "never one node's; binding each worker next to its GPU is handed to the engine (gpu_map, engine)"
            % (format_cpulist(base), local))


# ------------------------------------------------------------------- GPUs ---

def _gpus_for_instance(hints: _Hints, request: Request, index: int) -> Tuple[List[Dict[str, Any]], List[str]]:
    selection = request.gpus
    if selection == "none":
        return [], []
    if isinstance(selection, list):
        return _gpus_by_address(hints, selection), []
    # The reader already left out what is not a GPU (BMC video, NVSwitch).
    gpus = hints.gpus
    reasons = []  # type: List[str]
    if selection == "auto":
        if not gpus:
            return [], ["no GPUs found: placing by memory"]
        if request.instances > len(gpus):
            reasons.append("%d instances share %d GPU(s) round-robin" % (request.instances, len(gpus)))
        return [gpus[index % len(gpus)]], reasons
    first = index * selection
    if first + selection > len(gpus):
        raise PlacementError("gpus=%d per instance needs GPUs %d..%d for instance %d but this host has %d "
                             "GPU(s): lower gpus or instances" % (
                                 selection, first, first + selection - 1, index, len(gpus)))
    grouped = _node_ordered(hints, gpus)
    if selection > 1 and grouped != gpus:
        reasons.append("GPUs taken %d per instance in node order, one node's GPUs first: %s" % (
            selection, ", ".join(gpu["address"] for gpu in grouped)))
    return grouped[first:first + selection], reasons


def _node_ordered(hints: _Hints, gpus: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The GPUs by package, then node, then PCI address (those of no known node last), so that
    consecutive GPUs share a node, then a socket, wherever the PCI numbering interleaves them."""
    def key(gpu: Dict[str, Any]) -> Tuple[int, int, int, str]:
        node = _gpu_node(hints, gpu)[0]
        if node is None:
            return (1, 0, 0, gpu["address"])
        return (0, min(hints.candidates[node].packages or (0,)), node, gpu["address"])
    return sorted(gpus, key=key)


def _gpus_by_address(hints: _Hints, addresses: List[str]) -> List[Dict[str, Any]]:
    by_address = {gpu["address"].lower(): gpu for gpu in hints.gpus}
    missing = [address for address in addresses if address not in by_address]
    if missing:
        raise PlacementError("GPU(s) %s not found: this host has %s" % (
            ", ".join(missing), ", ".join(sorted(by_address)) or "no GPUs"))
    return [by_address[address] for address in addresses]


def _gpu_node(hints: _Hints, gpu: Dict[str, Any]) -> Tuple[Optional[int], Optional[str]]:
    """The usable node a GPU is local to, and a reason when that took more than a lookup."""
    address = gpu["address"]
    node = gpu.get("numa_node")
    if node is None:
        return None, "GPU %s reports no NUMA node: no locality preference from it" % address
    if node in hints.candidates:
        return node, None
    if node not in hints.node_ids:
        return None, "GPU %s reports node %d, which the topology does not list: no preference from it" % (
            address, node)
    nearest = min(hints.candidates, key=lambda other: (hints.distance(node, other), other))
    return nearest, "GPU %s is on node %d, which is not usable: %s; nearest usable node by SLIT is %d " \
        "(distance %d)" % (address, node, hints.excluded[node], nearest, hints.distance(node, nearest))


def _gpu_anchor(hints: _Hints, gpus: List[Dict[str, Any]]) -> Tuple[Optional[int], List[str]]:
    """The node local to most of the instance's GPUs (ties: lowest id), or None."""
    reasons = []
    local = {}
    for gpu in gpus:
        node, why = _gpu_node(hints, gpu)
        if why:
            reasons.append(why)
        if node is not None:
            local.setdefault(node, []).append(gpu["address"])
    if not local:
        return None, reasons
    best = min(local, key=lambda node: (-len(local[node]), node))
    reasons.append("node %d chosen: local to GPU %s" % (best, ", ".join(local[best])))
    return best, reasons


# ----------------------------------------------------------------- anchor ---

def _choose_anchor(hints: _Hints, request: Request, gpus: List[Dict[str, Any]],
                   state: _State, index: int) -> Tuple[int, List[str]]:
    if request.node is not None:
        return _explicit_anchor(hints, request.node, gpus)
    if request.anchors is not None:
        # Planned at deploy time from one snapshot: the instances already running have
        # used memory since, which would otherwise reshuffle the spread at every start.
        return _explicit_anchor(hints, request.anchors[index], gpus, "the deployment's anchor for instance %d"
                                % index)
    anchor, reasons = _gpu_anchor(hints, gpus)
    if anchor is not None:
        return anchor, reasons
    anchor, score_reasons = _score_anchor(hints, request, state)
    return anchor, reasons + score_reasons


def _explicit_anchor(hints: _Hints, node: int, gpus: List[Dict[str, Any]],
                     why: str = "requested explicitly") -> Tuple[int, List[str]]:
    if node not in hints.node_ids:
        raise PlacementError("node %d does not exist: this host has node(s) %s; pick one of them or leave "
                             "node unset for automatic placement" % (node, format_cpulist(hints.node_ids)))
    if node not in hints.candidates:
        raise PlacementError("node %d cannot be used: %s; usable node(s): %s -- pick one of them, widen "
                             "the cpuset or shrink reserve_cpus" % (
                                 node, hints.excluded[node], format_cpulist(hints.candidates) or "none"))
    reasons = ["node %d chosen: %s" % (node, why)]
    for gpu in gpus:
        local = _gpu_node(hints, gpu)[0]
        if local is not None and local != node:
            reasons.append("GPU %s is local to node %d, not to the requested node %d: its traffic "
                           "crosses the interconnect" % (gpu["address"], local, node))
    return node, reasons


def _score_anchor(hints: _Hints, request: Request, state: _State) -> Tuple[int, List[str]]:
    """Best 0.6 x free-memory ratio + 0.4 / (instances already there + 1); ties by lowest id.

    A node where the model fits always beats one where it does not.
    """
    required = request.required_bytes()
    pool = sorted(hints.candidates)
    if required is not None:
        fitting = [node for node in pool
                   if _free(hints, state, _scope_nodes(hints, request, node)) >= required]
        pool = fitting or pool
    best, best_score = pool[0], _score(hints, state, pool[0])
    for node in pool[1:]:  # ascending: a tie keeps the lower id
        score = _score(hints, state, node)
        if _higher(score, best_score):
            best, best_score = node, score
    numerator, denominator = best_score
    total = hints.candidates[best].total
    free_percent = 100 * _free(hints, state, [best]) // total if total else 0
    reason = "node %d chosen by memory score %.3f: %d%% of its memory available, %d instance(s) already there" % (
        best, numerator / denominator, free_percent, state.load[best])
    if len(pool) < len(hints.candidates):
        reason += " (only nodes where the model fits were considered)"
    return best, [reason]


def _score(hints: _Hints, state: _State, node: int) -> Tuple[int, int]:
    """The node's score, exactly: (numerator, denominator > 0). A node without a memory total has no free share."""
    total = hints.candidates[node].total
    free = _free(hints, state, [node]) if total else 0
    total = total or 1
    spread = state.load[node] + 1
    # MEMORY_FIFTHS/5 * free/total + SPREAD_FIFTHS/5 * 1/spread, over one denominator.
    return MEMORY_FIFTHS * free * spread + SPREAD_FIFTHS * total, 5 * total * spread


def _higher(score: Tuple[int, int], other: Tuple[int, int]) -> bool:
    return score[0] * other[1] > other[0] * score[1]


# ----------------------------------------------------------------- memory ---

def _scope_nodes(hints: _Hints, request: Request, anchor: int) -> List[int]:
    """The nodes an instance occupies at least: the anchor, or its whole package."""
    if request.scope == "node":
        return [anchor]
    return _package_nodes(hints, anchor)


def _package_nodes(hints: _Hints, anchor: int) -> List[int]:
    packages = set(hints.candidates[anchor].packages)
    if not packages:
        return [anchor]
    members = [node for node, info in hints.candidates.items() if packages & set(info.packages)]
    return hints.nearest_first(anchor, members)


def _place_memory(hints: _Hints, request: Request, anchor: int, state: _State,
                  span: Optional[List[int]] = None) -> _Placement:
    """Memory policy and nodes around ``anchor``; ``span``: the nodes of a spanning instance's GPUs,
    which it covers whole and is never bound to one node of (auto interleaves over them)."""
    base = span or _scope_nodes(hints, request, anchor)
    required = request.required_bytes()
    if request.policy == "preferred":
        return _preferred(hints, request, anchor, base, state)
    if required is None:
        return _unsized(hints, request, anchor, base, state, span is not None)
    fitting = _minimal_fit(hints, anchor, base, state, required)
    base_fits = fitting is not None and len(fitting) == len(base)
    if base_fits and span and request.policy == "auto":
        return _interleave(hints, anchor, base, state, [
            "%s fits %s (%s available): interleaving over the GPUs' nodes" % (
                _need(request), _nodes_text(base), format_size(_free(hints, state, base)))])
    if base_fits and request.policy not in INTERLEAVING:
        return _memory(hints, "bind", anchor, base, state, [
            "%s fits %s (%s available): binding" % (_need(request), _nodes_text(base),
                                                    format_size(_free(hints, state, base)))])
    if fitting is None:
        pool = hints.nearest_first(anchor, list(hints.candidates))
        raise PlacementError("%s does not fit even all usable node(s) %s together (%s available; "
                             "%d bytes needed): free memory, use a smaller model or a lower "
                             "memory_headroom, or leave model_size unset to skip the fit check" % (
                                 _need(request), format_cpulist(pool),
                                 format_size(_free(hints, state, pool)), required))
    if request.policy in INTERLEAVING:
        return _interleave(hints, anchor, fitting, state, [
            "%s requested: %s fits interleaved over %s, the fewest nodes nearest to node %d"
            % (request.policy, _need(request), _nodes_text(fitting), anchor)], request.policy)
    if request.on_unfit == "fail":
        raise PlacementError("%s does not fit %s (%s available; %d bytes needed) and on_unfit is 'fail': "
                             "set on_unfit to 'interleave' to spread it over nodes %s, free memory, or "
                             "use a smaller model or memory_headroom" % (
                                 _need(request), _nodes_text(base), format_size(_free(hints, state, base)),
                                 required, format_cpulist(fitting)))
    return _interleave(hints, anchor, fitting, state, [
        "%s does not fit %s (%s available); interleaving over nodes %s (nearest by SLIT, %s available)"
        % (_need(request), _nodes_text(base), format_size(_free(hints, state, base)), format_cpulist(fitting),
           format_size(_free(hints, state, fitting)))])


def _minimal_fit(hints: _Hints, anchor: int, base: List[int], state: _State,
                 required: int) -> Optional[List[int]]:
    """The shortest run of usable nodes whose free memory fits: base first, then the others (spill_order)."""
    order = hints.spill_order(anchor, base)
    for length in range(len(base), len(order) + 1):
        if _free(hints, state, order[:length]) >= required:
            return order[:length]
    return None


def _preferred(hints: _Hints, request: Request, anchor: int, base: List[int], state: _State) -> _Placement:
    required = request.required_bytes()
    memory = hints.memory_of([anchor])[0]  # a node without memory: the nearest that serves it
    free = state.free[memory]
    if required is None:
        why = "preferred memory on node %d (model size unknown)" % memory
    elif free >= required:
        why = "preferred memory on node %d: %s fits (%s available)" % (memory, _need(request), format_size(free))
    else:
        why = ("preferred memory on node %d: %s does not fit (%s available); the kernel spills the rest "
               "to other nodes" % (memory, _need(request), format_size(free)))
    return _Placement(anchor=anchor, policy="preferred", mem_nodes=[memory], cpu_nodes=base, gpus=[],
                      available=free, reasons=_served_by(hints, [anchor]) + [why])


def _unsized(hints: _Hints, request: Request, anchor: int, base: List[int], state: _State,
             spanning: bool) -> _Placement:
    if spanning and request.policy != "bind":
        return _interleave(hints, anchor, base, state, [
            "model size unknown: interleaving over the GPUs' nodes %s" % format_cpulist(base)])
    if request.policy in INTERLEAVING:
        package = _package_nodes(hints, anchor)
        return _interleave(hints, anchor, package, state, [
            "model size unknown: interleaving over the usable nodes of node %d's package (%s)"
            % (anchor, format_cpulist(package))], request.policy)
    return _memory(hints, "bind", anchor, base, state, [
        "model size unknown: binding to %s without a fit check" % _nodes_text(base)])


def _interleave(hints: _Hints, anchor: int, nodes: List[int], state: _State, reasons: List[str],
                asked: str = "auto") -> _Placement:
    """Interleave over the memory of ``nodes``: weighted where the kernel has weights and they differ, or where
    ``asked`` is weighted_interleave and the kernel has the policy (Linux 6.9+)."""
    weights = (hints.topology.get("kernel") or {}).get("weighted_interleave")
    memory = hints.memory_of(nodes)
    known = {node: weights[str(node)] for node in memory if str(node) in weights} if isinstance(weights, dict) else {}
    listed = ", ".join("node %d: %s" % (node, known[node]) for node in sorted(known))
    if asked == "weighted_interleave" and isinstance(weights, dict):
        return _memory(hints, "weighted-interleave", anchor, nodes, state,
                       reasons + ["weighted interleave, by the kernel's weights (%s)" % (listed or "none set")])
    if asked == "weighted_interleave":
        reasons = reasons + ["this kernel has no weighted interleave (Linux 6.9+): plain interleave, equal pages on "
                             "each node"]
    elif len(memory) > 1 and len(set(known.values())) > 1:
        return _memory(hints, "weighted-interleave", anchor, nodes, state,
                       reasons + ["kernel interleave weights differ (%s): using weighted interleave" % listed])
    far = [node for node in memory if node in hints.far_memory]
    if far:
        reasons = reasons + ["node(s) %s are far memory, slower than DRAM, yet get as many pages: give the kernel "
                             "weights by bandwidth (numa_host_interleave_weights) for weighted interleave"
                             % format_cpulist(far)]
    return _memory(hints, "interleave", anchor, nodes, state, reasons)


# The request policies that interleave (weighted or not).
INTERLEAVING = ("interleave", "weighted_interleave")


def _memory(hints: _Hints, policy: str, anchor: int, nodes: List[int], state: _State,
            reasons: List[str]) -> _Placement:
    """The placement of ``policy`` on the CPUs of ``nodes`` and the memory serving them."""
    return _Placement(anchor=anchor, policy=policy, mem_nodes=hints.memory_of(nodes), cpu_nodes=hints.cpu_nodes(nodes),
                      gpus=[], available=_free(hints, state, nodes), reasons=_served_by(hints, nodes) + reasons)


def _served_by(hints: _Hints, nodes: List[int]) -> List[str]:
    """A reason for each of ``nodes`` whose CPUs use other nodes' memory (a node without its own)."""
    reasons = []
    for node in hints.cpu_nodes(nodes):
        info = hints.candidates[node]
        if info.memory != (node,):
            source = {"hmat": "HMAT", "slit": "nearest by SLIT"}.get(info.memory_from or "", "the facts")
            reasons.append("node %d has no memory of its own: its memory is node(s) %s (%s)" % (
                node, format_cpulist(info.memory), source))
    return reasons


def _free(hints: _Hints, state: _State, nodes: List[int]) -> int:
    """Bytes left on the memory serving the candidate nodes ``nodes``."""
    return sum(state.free[memory] for memory in hints.memory_of(nodes))


def _need(request: Request) -> str:
    return "model %s + headroom %s (%s) = %s" % (
        format_size(request.model_size), format_size(request.headroom_bytes()), request.memory_headroom,
        format_size(request.required_bytes()))


def _nodes_text(nodes: List[int]) -> str:
    if len(nodes) == 1:
        return "node %d" % nodes[0]
    return "nodes %s" % format_cpulist(nodes)


# ------------------------------------------------------------------- CPUs ---

def _assign_cpus(hints: _Hints, placements: List[Optional[_Placement]], index: int,
                 smt: bool) -> Tuple[List[int], List[str]]:
    """CPUs of the instance's cpu_nodes; instances sharing a node split its cores in instance order."""
    cpus = []
    reasons = []
    for node in placements[index].cpu_nodes:
        users = [other for other, placement in enumerate(placements)
                 if placement is not None and node in placement.cpu_nodes]
        cores, why = _node_share(hints, node, users, index)
        if why:
            reasons.append(why)
        for core in cores:
            cpus.extend(core if smt else core[:1])
    if not smt:
        reasons.append("smt off: one CPU per physical core (%d CPUs)" % len(cpus))
    return sorted(cpus), reasons


def _node_share(hints: _Hints, node: int, users: List[int], index: int) -> Tuple[List[Tuple[int, ...]], Optional[str]]:
    cores = _cores(hints, node)
    if len(users) == 1:
        return cores, None
    if len(cores) < len(users):
        return cores, "node %d has %d usable core(s) for instances %s: they share all of them" % (
            node, len(cores), format_cpulist(users))
    rank = users.index(index)
    share = cores[rank * len(cores) // len(users):(rank + 1) * len(cores) // len(users)]
    return share, "node %d is shared by instances %s: this instance gets %d of its %d cores" % (
        node, format_cpulist(users), len(share), len(cores))


def _cores(hints: _Hints, node: int) -> List[Tuple[int, ...]]:
    """The node's usable CPUs grouped by physical core, each group sorted, groups by first CPU."""
    usable = hints.candidates[node].cpus
    cores = set()
    for cpu in usable:
        group = hints.core_of.get(cpu, (cpu,))
        cores.add(tuple(sibling for sibling in group if sibling in usable))
    return sorted(cores)


# ---------------------------------------------------------------- GPU map ---

def _gpu_map(hints: _Hints, placement: _Placement, cpus: List[int],
             smt: bool) -> Tuple[List[Dict[str, Any]], List[str]]:
    """Per GPU of the instance, in the order the server sees them: the node, CPUs and memory node
    for the worker that drives it, the GPU's own memory node, and the NICs on its node.

    Workers of GPUs on one node split the instance's CPUs there by core, in GPU order. A GPU of no
    known node gets the instance's anchor node; one whose node is not the instance's, all its CPUs.
    """
    mine = set(cpus)
    nodes = []  # type: List[int]
    reasons = []
    for gpu in placement.gpus:
        node = _gpu_node(hints, gpu)[0]
        if node is None:
            node = placement.anchor
            reasons.append("gpu_map: GPU %s has no known node; its worker goes with the instance on node %d"
                           % (gpu["address"], node))
        nodes.append(node)
    result = []
    for position, (gpu, node) in enumerate(zip(placement.gpus, nodes)):
        local = sorted(mine & set(hints.candidates[node].cpus))
        sharing = [other for other, other_node in enumerate(nodes) if other_node == node]
        worker_cpus = _core_share(hints, local, sharing.index(position), len(sharing), smt) if local else cpus
        memory = [serving for serving in hints.memory_of([node]) if serving in placement.mem_nodes]
        result.append({
            "gpu": gpu["address"], "node": node, "cpulist": format_cpulist(worker_cpus),
            "mem_nodes": memory or sorted(placement.mem_nodes), "memory_node": gpu.get("memory_node"),
            "nics": _near_nics(hints.nics, gpu, node),
        })
    return result, reasons + _idle_rdma(hints.nics, result)


# How near a NIC is to a GPU, nearest first (NCCL's PIX/PXB, PHB and NODE): they share a PCIe bridge (traffic
# between them stays below it), a host bridge, or only the worker's NUMA node.
NIC_NEARNESS = ("pcie_switch", "host_bridge", "node")


def _near_nics(nics: List[Dict[str, Any]], gpu: Dict[str, Any], node: int) -> List[Dict[str, Any]]:
    """The NICs near ``gpu`` (its worker on ``node``), nearest first (NIC_NEARNESS), each with how near."""
    found = []
    for nic in nics:
        near = _nic_nearness(gpu, nic, node)
        if near:
            entry = {"address": nic.get("address"), "name": nic.get("name"), "rdma_name": nic.get("rdma_name"),
                     "near": near}
            if nic.get("rdma_name"):
                # Every port, whatever its state: UCX and NCCL skip one that is not active, and a link going up or
                # down must not change the plan's record (a restart). Only an RDMA NIC has the key, so a plan whose
                # NICs have no RDMA device records the map it recorded before ports were read.
                entry["ports"] = [port["port"] for port in _rdma_ports(nic)]
            found.append(entry)
    return sorted(found, key=lambda nic: (NIC_NEARNESS.index(nic["near"]), str(nic["address"])))


def _rdma_ports(nic: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The facts' ``rdma_ports`` of ``nic`` that are what numa_facts writes (facts may come from elsewhere)."""
    ports = nic.get("rdma_ports")
    return [port for port in ports if isinstance(port, dict) and isinstance(port.get("port"), int)
            and not isinstance(port["port"], bool) and port["port"] >= 1] if isinstance(ports, list) else []


# The port states that carry traffic (ACTIVE_DEFER: active, its errors held back).
_ACTIVE_PORT_STATES = ("ACTIVE", "ACTIVE_DEFER")


def _idle_rdma(nics: List[Dict[str, Any]], gpu_map: List[Dict[str, Any]]) -> List[str]:
    """A reason per RDMA NIC nearest a GPU of the map whose every port's state is known and none active: NCCL and
    UCX skip such a port, so that traffic leaves by another NIC, farther away, or not at all. A NIC whose ports'
    states are not all known is not said to be down."""
    ports_of = {nic.get("address"): _rdma_ports(nic) for nic in nics}
    idle = {}  # type: Dict[str, List[str]]
    for entry in gpu_map:
        for nic in nearest_rdma(entry):
            states = [port.get("state") for port in ports_of.get(nic["address"]) or ()]
            if states and None not in states and not set(states) & set(_ACTIVE_PORT_STATES):
                idle.setdefault("%s (%s)" % (nic["rdma_name"], ", ".join(
                    "port %d %s" % (port["port"], port["state"]) for port in ports_of[nic["address"]])), []).append(
                    entry["gpu"])
    return ["RDMA NIC %s, the nearest to GPU(s) %s, has no active port: NCCL and UCX skip it, so their traffic to "
            "other hosts takes a farther NIC or none; bring its link up" % (nic, ", ".join(gpus))
            for nic, gpus in sorted(idle.items())]


def _nic_nearness(gpu: Dict[str, Any], nic: Dict[str, Any], node: int) -> Optional[str]:
    """One of NIC_NEARNESS by the devices' facts ``pci_path`` (host bridge, then the bridges below it) and the NIC's
    node; None when it is on another node."""
    shared = 0
    for mine, theirs in zip(_bridges(gpu), _bridges(nic)):
        if mine != theirs:
            break
        shared += 1
    if shared > 1:
        return NIC_NEARNESS[0]
    if shared:
        return NIC_NEARNESS[1]
    return NIC_NEARNESS[2] if nic.get("numa_node") == node else None


def _bridges(device: Dict[str, Any]) -> List[str]:
    path = device.get("pci_path")
    return path if isinstance(path, list) and all(isinstance(part, str) for part in path) else []


def _core_share(hints: _Hints, cpus: List[int], rank: int, sharers: int, smt: bool) -> List[int]:
    """Share ``rank`` of ``sharers`` of ``cpus`` by physical core (all of them when cores are fewer)."""
    cores = sorted({tuple(sibling for sibling in hints.core_of.get(cpu, (cpu,)) if sibling in cpus) for cpu in cpus})
    if len(cores) >= sharers:
        cores = cores[rank * len(cores) // sharers:(rank + 1) * len(cores) // sharers]
    return sorted(cpu for core in cores for cpu in (core if smt else core[:1]))


# -------------------------------------------------------------------- env ---

def _environment(hints: _Hints, gpus: List[Dict[str, Any]], threads: int) -> Tuple[Dict[str, str], List[str]]:
    env, uncovered = visibility_env(gpus, hints.gpus)
    reasons = ["GPU %s (%s): no visibility variable is set for this vendor" % (
        gpu["address"], gpu.get("vendor") or "unknown vendor") for gpu in uncovered]
    env["OMP_NUM_THREADS"] = str(threads)
    return env, reasons
