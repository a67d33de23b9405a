"""The GPU vendor table: the reader and the planner both take vendors from it, so one entry adds one."""

from ansible_collections.inferops.numa.plugins.module_utils.numa.base import gpu_vendors
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.placement import Request, plan
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.topology import read

from tests.fixtures import sysfs

NODE1 = list(range(40, 80)) + list(range(120, 160))


def mixed_box(tmp_path, *extra):
    """dual_socket_gpus (2 NVIDIA) plus an AMD, an Intel and the ``extra`` (address, vendor id) GPUs on node 1."""
    machine = sysfs.dual_socket_gpus()
    machine.add_pci("0000:83:00.0", 0x038000, 0x1002, 0x74a1, 1, NODE1)
    machine.add_pci("0000:84:00.0", 0x038000, 0x1002, 0x74a1, 1, NODE1)
    machine.add_pci("0000:85:00.0", 0x038000, 0x8086, 0x0bd5, 1, NODE1)
    for address, vendor in extra:
        machine.add_pci(address, 0x120000, vendor, 0x0001, 1, NODE1)
    return read(machine.write(str(tmp_path)))


def test_names_come_from_the_pci_vendor_id():
    assert [gpu_vendors.vendor_name(pci_id) for pci_id in ("0x10de", "0x1002", "0x8086", "0x10DE")] == [
        "nvidia", "amd", "intel", "nvidia"]
    assert gpu_vendors.vendor_name("0x15b3") == gpu_vendors.vendor_name(None) == "other"


def test_existing_vendors_each_get_their_variable_and_index(tmp_path):
    facts = mixed_box(tmp_path)
    by_address = {gpu["address"]: gpu for gpu in facts["gpus"]}
    assert [by_address[a]["vendor"] for a in ("0000:81:00.0", "0000:83:00.0", "0000:85:00.0")] == [
        "nvidia", "amd", "intel"]
    assert [gpu["cuda_index"] for gpu in facts["gpus"]] == [0, None, None, None, 1]
    chosen = ["0000:c1:00.0", "0000:84:00.0", "0000:85:00.0"]
    result = plan(facts, Request(gpus=chosen))
    assert result.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1",
                          "ROCR_VISIBLE_DEVICES": "1", "OMP_NUM_THREADS": str(len(result.cpus))}
    assert "GPU 0000:85:00.0 (intel): no visibility variable is set for this vendor" in result.reasons


def test_one_entry_adds_a_vendor_to_the_reader_and_the_planner(tmp_path, monkeypatch):
    entry = gpu_vendors.GpuVendor("moore", "0x1ed5", "MUSA_VISIBLE_DEVICES", {"MUSA_ORDER": "PCI"}, "musa_index")
    monkeypatch.setattr(gpu_vendors, "VENDORS", gpu_vendors.VENDORS + (entry,))
    facts = mixed_box(tmp_path, ("0000:86:00.0", 0x1ed5), ("0000:87:00.0", 0x1ed5))
    moore = [gpu for gpu in facts["gpus"] if gpu["vendor"] == "moore"]
    assert [(gpu["musa_index"], gpu["cuda_index"]) for gpu in moore] == [(0, None), (1, None)]
    assert all(gpu["musa_index"] is None for gpu in facts["gpus"] if gpu["vendor"] != "moore")
    result = plan(facts, Request(gpus=["0000:87:00.0"]))
    assert result.env == {"MUSA_ORDER": "PCI", "MUSA_VISIBLE_DEVICES": "1", "OMP_NUM_THREADS": str(len(result.cpus))}
    assert not any("visibility variable" in reason for reason in result.reasons)


def test_index_without_the_readers_field_is_the_bus_ordinal(tmp_path):
    facts = mixed_box(tmp_path)
    for gpu in facts["gpus"]:
        gpu["cuda_index"] = None
    env = plan(facts, Request(gpus=["0000:c1:00.0", "0000:83:00.0"])).env
    assert (env["CUDA_VISIBLE_DEVICES"], env["ROCR_VISIBLE_DEVICES"]) == ("1", "0")
