"""GPU vendors, one table entry each: what the facts call them and how a server is shown its GPUs.

An entry holds the vendor's PCI vendor id (topology.py names every PCI device's vendor
from it), the environment variable that limits a server to the GPUs it was given, the
variables that must come with it, and the facts field in which topology.py records
each GPU's index (placement.py uses it when present), and the kind of its CDI device names, by which a
container runtime is given a GPU (base/containers). Every vendor's index is its
ordinal among the same vendor's GPUs in PCI bus order. Supporting another vendor is
adding an entry; neither the reader nor the planner names a vendor.

numa-pin exec imports this module at every server start, so ``typing`` is imported
for type checkers only.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

OTHER = "other"


class GpuVendor:
    """One vendor: its facts name, PCI vendor id, visibility variable, index field and CDI device kind."""

    __slots__ = ("name", "pci_id", "visible_devices", "with_env", "index_fact", "cdi_kind")

    def __init__(self, name: str, pci_id: str, visible_devices: Optional[str] = None,
                 with_env: Optional[Mapping[str, str]] = None, index_fact: Optional[str] = None,
                 cdi_kind: Optional[str] = None) -> None:
        self.name = name
        self.pci_id = pci_id
        self.visible_devices = visible_devices
        self.with_env = dict(with_env or {})
        self.index_fact = index_fact
        self.cdi_kind = cdi_kind


VENDORS = (
    # CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER asks for bus order.
    GpuVendor("nvidia", "0x10de", "CUDA_VISIBLE_DEVICES", {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, "cuda_index",
              "nvidia.com/gpu"),
    # CDI names by the vendors' container toolkits (nvidia-ctk cdi generate, amd-ctk cdi generate).
    GpuVendor("amd", "0x1002", "ROCR_VISIBLE_DEVICES", cdi_kind="amd.com/gpu"),
    # No variable yet (Level Zero's would be ZE_AFFINITY_MASK): a plan reason names the GPU instead.
    GpuVendor("intel", "0x8086"),
)


def vendor_name(pci_id: Optional[str]) -> str:
    """The facts name of a PCI vendor id such as "0x10de"; "other" for a vendor not in the table."""
    wanted = (pci_id or "").lower()
    return next((vendor.name for vendor in VENDORS if vendor.pci_id == wanted), OTHER)


def bus_ordinal(gpu: Mapping[str, Any], gpus: Sequence[Mapping[str, Any]]) -> int:
    """The GPU's position among the host's GPUs of its vendor, in PCI bus order."""
    same = sorted(other["address"] for other in gpus if other.get("vendor") == gpu.get("vendor"))
    return same.index(gpu["address"])


def index_facts(gpu: Mapping[str, Any], gpus: Sequence[Mapping[str, Any]]) -> Dict[str, Optional[int]]:
    """Every vendor's index field for one GPU record: its index in its own vendor's, null in the others
    (every GPU record carries them all)."""
    return {vendor.index_fact: bus_ordinal(gpu, gpus) if vendor.name == gpu.get("vendor") else None
            for vendor in VENDORS if vendor.index_fact}


def visibility_env(chosen: Sequence[Mapping[str, Any]],
                   gpus: Sequence[Mapping[str, Any]]) -> Tuple[Dict[str, str], List[Mapping[str, Any]]]:
    """(the variables that show a server the ``chosen`` GPUs of the host's ``gpus``, the chosen GPUs
    no variable covers), variables in table order."""
    env = {}  # type: Dict[str, str]
    for vendor in VENDORS:
        mine = [gpu for gpu in chosen if gpu.get("vendor") == vendor.name]
        if mine and vendor.visible_devices:
            env.update(vendor.with_env)
            env[vendor.visible_devices] = ",".join(str(_index(vendor, gpu, gpus)) for gpu in mine)
    covered = {vendor.name for vendor in VENDORS if vendor.visible_devices}
    return env, [gpu for gpu in chosen if gpu.get("vendor") not in covered]


def _index(vendor: GpuVendor, gpu: Mapping[str, Any], gpus: Sequence[Mapping[str, Any]]) -> int:
    # topology.py records it by the same rule; a topology without it (made by hand) gets it here.
    recorded = gpu.get(vendor.index_fact) if vendor.index_fact else None
    return recorded if recorded is not None else bus_ordinal(gpu, gpus)
