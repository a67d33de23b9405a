"""Where the interrupts of the devices the inference servers use are served: on the device's own node, on CPUs no
server's threads run on where the node has any.

A device's interrupt handler touches its queues and the buffers it fills, which live on its node; served on the far
socket every completion crosses the link, and served on a server's compute CPUs it preempts a decode thread (the
jitter tuned's cpu-partitioning profile and the NRI plugins move them away for). So each device of an instance (its
GPUs, and the NICs and NVMe drives on the nodes its CPUs are on) gets its node's CPUs that no plan on the host hands
to a server (housekeeping CPUs a ``reserve_cpus`` keeps out, CPUs no instance took), less the kernel's isolated
ones; where every CPU of the node runs a server, the node's CPUs: still local, the link is the larger cost.

The rule is the host's, not one instance's: two instances on a node share its NICs, and each device gets one answer.
Pure: the facts and the plan records come in, the targets go out.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple

from ..base.cpulist import format_cpulist, is_pci_address, parse_cpulist
from ..base.errors import NumaError


class IrqTarget(NamedTuple):
    """One device whose interrupts follow the plans."""

    address: str  # PCI address, as sysfs names the device
    kind: str  # gpu, nic or nvme
    node: int
    cpus: Tuple[int, ...]
    spare: bool  # True: CPUs no server runs on; False: the node has none, its servers' CPUs are used


# The facts' device lists whose interrupts follow the plans.
DEVICE_KINDS = (("gpus", "gpu"), ("nics", "nic"), ("nvme", "nvme"))


def irq_targets(topology: Mapping[str, Any], plans: Sequence[Mapping[str, Any]]) -> Tuple[List[IrqTarget], List[str]]:
    """The devices of ``plans`` (plan records: their ``cpus``, ``gpus`` and ``gpu_map``) with the CPUs their
    interrupts go to, by PCI address; and why a device of theirs is left alone."""
    node_cpus = {node["id"]: set(node.get("cpus") or ()) for node in topology.get("nodes") or ()
                 if node.get("cpus")}
    used = set().union(*[_plan_cpus(plan) for plan in plans]) if plans else set()  # type: Set[int]
    served = {node for node, cpus in node_cpus.items() if cpus & used}
    gpus = {address for plan in plans for address in _plan_gpus(plan)}
    isolated = _isolated(topology)
    targets, reasons = [], []
    for facts_key, kind in DEVICE_KINDS:
        for device in topology.get(facts_key) or ():
            address, node = device.get("address"), device.get("numa_node")
            if not isinstance(address, str) or not (address in gpus if kind == "gpu" else node in served):
                continue
            if node not in node_cpus:
                reasons.append("%s %s: its node is not known (%s), its interrupts are left where they are"
                               % (kind, address, "no NUMA affinity in sysfs" if node is None
                                  else "node %s has no CPUs" % node))
                continue
            spare = node_cpus[node] - used - isolated
            local = spare or (node_cpus[node] - isolated) or node_cpus[node]
            targets.append(IrqTarget(address, kind, node, tuple(sorted(local)), bool(spare)))
    targets.sort()
    for target in targets:
        if not target.spare:
            reasons.append("%s %s: every CPU of node %d runs a server, its interrupts share them (%s)"
                           % (target.kind, target.address, target.node, format_cpulist(target.cpus)))
    return targets, reasons


def instance_targets(table: Sequence[IrqTarget], plan: Mapping[str, Any]) -> List[IrqTarget]:
    """The devices of ``table`` that are one instance's (its GPUs; the NICs and NVMe drives on the nodes its CPUs
    are on, the record's ``cpu_nodes``): what its audit holds to the table."""
    gpus = set(_plan_gpus(plan))
    nodes = plan.get("cpu_nodes")
    cpu_nodes = set(nodes) if isinstance(nodes, list) and all(
        isinstance(node, int) and not isinstance(node, bool) for node in nodes) else set()  # type: Set[int]
    return [target for target in table
            if (target.address in gpus if target.kind == "gpu" else target.node in cpu_nodes)]


def _plan_cpus(plan: Mapping[str, Any]) -> Set[int]:
    cpus = plan.get("cpus")
    if isinstance(cpus, list) and all(isinstance(cpu, int) and not isinstance(cpu, bool) for cpu in cpus):
        return set(cpus)
    try:
        return set(parse_cpulist(str(plan.get("cpulist") or "")))
    except NumaError:
        return set()


def _plan_gpus(plan: Mapping[str, Any]) -> Iterable[str]:
    for gpu in plan.get("gpus") or ():
        address = gpu.get("address") if isinstance(gpu, dict) else gpu
        if isinstance(address, str):
            yield address
    for entry in plan.get("gpu_map") or ():
        if isinstance(entry, dict) and isinstance(entry.get("gpu"), str):
            yield entry["gpu"]


def _isolated(topology: Mapping[str, Any]) -> Set[int]:
    """The CPUs the kernel keeps interrupts off by its command line (isolcpus, nohz_full): not the collection's to
    fill."""
    cpus = topology.get("cpus") or {}
    found = set()  # type: Set[int]
    for key in ("isolated", "nohz_full"):
        try:
            found.update(parse_cpulist(str(cpus.get(key) or "")))
        except NumaError:
            continue
    return found


def table_text(targets: Sequence[IrqTarget], owner: str) -> Optional[str]:
    """The persisted table: a line per device, ``<PCI address> <CPU list> <kind> <node> spare|shared`` (the boot unit
    applies the first two, the irqbalance policy script bans the first); None for no device."""
    if not targets:
        return None
    lines = ["# Written by inferops.numa (%s): each device's interrupts are served on these CPUs, set again at boot;"
             % owner, "# irqbalance leaves them alone (its policy script bans the devices listed)."]
    lines.extend("%s %s %s %d %s" % (target.address, format_cpulist(target.cpus), target.kind, target.node,
                                     "spare" if target.spare else "shared") for target in targets)
    return "\n".join(lines) + "\n"


_KINDS = {kind for _key, kind in DEVICE_KINDS}
_SPARE = {"spare": True, "shared": False}


def parse_table(text: str) -> List[IrqTarget]:
    """A table's devices, as ``table_text`` wrote them; NumaError naming the first line that is not one it writes."""
    targets = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if (len(words) != 5 or not is_pci_address(words[0]) or words[2] not in _KINDS or not words[3].isdigit()
                or words[4] not in _SPARE):
            raise NumaError("line %d is not '<PCI address> <CPU list> <gpu|nic|nvme> <node> <spare|shared>'"
                            % number)
        try:
            cpus = tuple(parse_cpulist(words[1]))
        except NumaError as exc:
            raise NumaError("line %d: %s" % (number, exc)) from None
        targets.append(IrqTarget(words[0], words[2], int(words[3]), cpus, _SPARE[words[4]]))
    return sorted(targets)
