"""Every real machine dump from hwloc's test suite, read and checked two ways.

1. Against the raw sysfs files of the dump, parsed here independently.
2. Against hwloc itself (``lstopo --of xml`` with HWLOC_FSROOT) where installed,
   minding where hwloc departs on purpose: it drops nodes and PUs outside the
   captured process's cpuset.

The dumps live in ../shared/fixtures/hwloc-linux (never copied into this repo);
without them these tests skip.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ElementTree

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import governor
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.device_irqs import irq_targets
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.placement import PlacementError, Request, plan
from ansible_collections.inferops.numa.plugins.module_utils.numa.read import topology
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.kernel_files import Root
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.topology import read

from tests.tools import HWLOC_DUMPS, ansible_command, hwloc_dumps, needs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARBALLS = sorted(glob.glob(os.path.join(HWLOC_DUMPS, "*.tar.bz2")))

pytestmark = hwloc_dumps()


@pytest.fixture(scope="session")
def dump_roots(tmp_path_factory):
    """Tarball name -> extracted filesystem root (its single top folder)."""
    roots = {}
    for tarball in TARBALLS:
        name = os.path.basename(tarball)[: -len(".tar.bz2")]
        target = tmp_path_factory.mktemp(name.replace("+", "_"))
        with tarfile.open(tarball) as archive:
            archive.extractall(str(target), filter="tar") if hasattr(tarfile, "data_filter") \
                else archive.extractall(str(target))
        (top,) = os.listdir(str(target))
        roots[name] = os.path.join(str(target), top)
    return roots


def raw(root, rel):
    try:
        with open(os.path.join(root, rel), "rb") as handle:
            return handle.read().replace(b"\x00", b"").decode("utf-8", "replace").strip()
    except OSError:
        return None


def ids_of(text):
    """Independent little cpulist parser, the oracle for the reader's."""
    result = set()
    for item in filter(None, (text or "").split(",")):
        first, _, last = item.partition("-")
        result.update(range(int(first), int(last or first) + 1))
    return result


def online_cpus(root):
    listed = raw(root, "sys/devices/system/cpu/online")
    if listed:
        return ids_of(listed)
    present = [int(m.group(1)) for m in (re.match(r"cpu(\d+)$", name) for name in
               os.listdir(os.path.join(root, "sys/devices/system/cpu"))) if m]
    return {cpu for cpu in present if raw(root, "sys/devices/system/cpu/cpu%d/online" % cpu) != "0"}


@pytest.mark.parametrize("name", [os.path.basename(t)[: -len(".tar.bz2")] for t in TARBALLS])
def test_dump_matches_raw_sysfs(dump_roots, name):
    root = dump_roots[name]
    facts = read(root)
    json.dumps(facts)
    online = online_cpus(root)
    node_dir = os.path.join(root, "sys/devices/system/node")
    node_ids = sorted(int(n[4:]) for n in (os.listdir(node_dir) if os.path.isdir(node_dir) else [])
                      if re.match(r"node\d+$", n))
    if not node_ids:
        assert [n["id"] for n in facts["nodes"]] == [0]
        assert set(facts["nodes"][0]["cpus"]) == online
        return
    assert [n["id"] for n in facts["nodes"]] == node_ids
    covered = set()
    for node in facts["nodes"]:
        listed = raw(root, "sys/devices/system/node/node%d/cpulist" % node["id"])
        if listed is not None:
            # A CPU claimed by several nodes (broken firmware) stays with the lowest one.
            assert set(node["cpus"]) == (ids_of(listed) & online) - covered, node["id"]
        covered |= set(node["cpus"])
        meminfo = raw(root, "sys/devices/system/node/node%d/meminfo" % node["id"]) or ""
        total = re.search(r"MemTotal:\s+(\d+)", meminfo)
        assert node["memory_total_kb"] == (int(total.group(1)) if total else 0)
        distance = (raw(root, "sys/devices/system/node/node%d/distance" % node["id"]) or "").split()
        if len(distance) == len(node_ids):
            assert [node["distances"][str(other)] for other in node_ids] == [int(d) for d in distance]
    assert covered <= online
    assert facts["distances"] == [[n["distances"].get(str(o)) for o in node_ids] for n in facts["nodes"]]


@pytest.mark.parametrize("name", [os.path.basename(t)[: -len(".tar.bz2")] for t in TARBALLS])
def test_dump_pci_devices_match_raw_classes(dump_roots, name):
    root = dump_roots[name]
    facts = read(root)
    pci_dir = os.path.join(root, "sys/bus/pci/devices")
    expected_gpus = []
    for address in sorted(os.listdir(pci_dir)) if os.path.isdir(pci_dir) else []:
        device_class = int(raw(root, "sys/bus/pci/devices/%s/class" % address) or "0", 16)
        vendor = raw(root, "sys/bus/pci/devices/%s/vendor" % address)
        if device_class >> 8 in (0x0300, 0x0302, 0x0380, 0x1200) and vendor not in ("0x1a03", "0x102b"):
            expected_gpus.append(address)
    assert [gpu["address"] for gpu in facts["gpus"]] == expected_gpus
    for device in facts["gpus"] + facts["nics"] + facts["nvme"]:
        listed = raw(root, "sys/bus/pci/devices/%s/numa_node" % device["address"])
        if listed is not None and int(listed) >= 0:
            assert device["numa_node"] == int(listed)


@pytest.mark.parametrize("name", [os.path.basename(t)[: -len(".tar.bz2")] for t in TARBALLS])
def test_dump_pci_paths_are_the_bus_links_bridges(dump_roots, name):
    """Each GPU's and NIC's pci_path is what its sys/bus/pci/devices link names between the host bridge and the
    device, read here with os.readlink and a regular expression."""
    root = dump_roots[name]
    facts = read(root)
    for device in facts["gpus"] + facts["nics"]:
        link = os.path.join(root, "sys/bus/pci/devices", device["address"])
        found = re.search(r"/(pci[0-9a-f]{4,8}:[0-9a-f]{2}(?:/[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])*)$",
                          os.readlink(link)) if os.path.islink(link) else None
        expected = found.group(1).split("/")[:-1] if found and found.group(1).endswith(device["address"]) else []
        assert device["pci_path"] == expected, device["address"]


def rdma_devices(root):
    """(the PCI device's sysfs path under root, its RDMA device's name) for every RDMA device of a dump."""
    devices = os.path.join(root, "sys/bus/pci/devices")
    return [("sys/bus/pci/devices/%s" % address, name) for address in sorted(os.listdir(devices))
            if os.path.isdir(os.path.join(devices, address, "infiniband"))
            for name in sorted(os.listdir(os.path.join(devices, address, "infiniband")))] if os.path.isdir(devices) else []


@pytest.mark.parametrize("name", [os.path.basename(t)[: -len(".tar.bz2")] for t in TARBALLS])
def test_dump_rdma_ports_are_the_raw_port_directories(dump_roots, name):
    """Each RDMA device's ports as the reader reads them are its ports/ directory, read here with os.listdir and
    plain text; and the facts list each as a NIC with those ports (whatever its PCI class: these dumps' are 0x0280
    and 0x0c06)."""
    root = dump_roots[name]
    for base, rdma_name in rdma_devices(root):
        ports = os.path.join(root, base, "infiniband", rdma_name, "ports")
        reader = topology._Reader(Root(root))
        assert topology._rdma_ports(reader, base, rdma_name) == [
            {"port": number, "state": raw(ports, "%d/state" % number).partition(": ")[2],
             "link_layer": raw(ports, "%d/link_layer" % number)}
            for number in sorted(int(entry) for entry in os.listdir(ports))], base
        assert reader.warnings == []
        address = base.rsplit("/", 1)[1]
        assert [(nic["rdma_name"], nic["rdma_ports"]) for nic in read(root)["nics"] if nic["address"] == address] == [
            (rdma_name, topology._rdma_ports(reader, base, rdma_name))], address


def test_the_dumps_rdma_ports_are_there_to_check(dump_roots):
    """The test above checks something: two dumps have an RDMA device, each with one active InfiniBand port."""
    found = {name: [(rdma_name, topology._rdma_ports(topology._Reader(Root(root)), base, rdma_name))
                    for base, rdma_name in rdma_devices(root)] for name, root in dump_roots.items()}
    port = [{"port": 1, "state": "ACTIVE", "link_layer": "InfiniBand"}]
    assert {name: ports for name, ports in found.items() if ports} == {
        "32em64t-2n8c+dax+nvme+mic+dimms": [("mlx4_0", port)], "40intel64-2g2n4c+pcilocality": [("qib0", port)]}


@pytest.mark.parametrize("name", [os.path.basename(t)[: -len(".tar.bz2")] for t in TARBALLS])
def test_dump_cpufreq_policies_are_the_raw_files(dump_roots, name):
    """numa_governor's reading of each cpufreq policy (its CPUs, governor and the governors it offers) is what the
    dump's files say, read here as plain text."""
    root = dump_roots[name]
    directory = os.path.join(root, "sys/devices/system/cpu/cpufreq")
    names = [entry for entry in (os.listdir(directory) if os.path.isdir(directory) else [])
             if re.match(r"policy\d+$", entry)]
    expected = {entry: (ids_of((raw(root, "sys/devices/system/cpu/cpufreq/%s/related_cpus" % entry) or "")
                               .replace(" ", ",")),
                        raw(root, "sys/devices/system/cpu/cpufreq/%s/scaling_governor" % entry),
                        tuple((raw(root, "sys/devices/system/cpu/cpufreq/%s/scaling_available_governors" % entry)
                               or "").split())) for entry in names}
    assert {policy.name: (set(policy.cpus), policy.governor, policy.available)
            for policy in governor.read_policies(root)} == expected


def hwloc_kinds(name):
    """The CPU kinds hwloc found when the dump was captured, fastest first, from its console output ("CPU kind #i
    efficiency e cpuset 0x...") or its XML (<cpukind cpuset=...>, which orders them the same way); None when the
    dump has neither."""
    base = os.path.join(HWLOC_DUMPS, name)
    if os.path.exists(base + ".console"):
        with open(base + ".console") as handle:
            found = re.findall(r"^CPU kind #\d+ efficiency (\d+) cpuset (\S+)$", handle.read(), re.MULTILINE)
        return [mask_cpus(mask) for _efficiency, mask in sorted(found, key=lambda kind: -int(kind[0]))]
    if os.path.exists(base + ".xml"):
        kinds = [kind.get("cpuset") for kind in ElementTree.parse(base + ".xml").iter("cpukind")]
        return [mask_cpus(mask) for mask in reversed(kinds)]  # hwloc writes the least efficient first
    return None


def mask_cpus(mask):
    """hwloc's cpuset text (32-bit words, "0xffffffff,0x000000ff") as a set of CPU numbers."""
    bits = int(mask.replace("0x", "").replace(",", ""), 16)
    return {cpu for cpu in range(bits.bit_length()) if bits >> cpu & 1}


@pytest.mark.parametrize("name", [os.path.basename(t)[: -len(".tar.bz2")] for t in TARBALLS])
def test_dump_cpu_kinds_are_hwlocs(dump_roots, name):
    """Where hwloc told CPU kinds apart (a hybrid laptop: 6 P-cores with SMT, 8 E-cores), the facts list the same
    groups, fastest first, with the highest maximum frequency the raw files give each; where it found one kind or
    none, the facts list none."""
    root = dump_roots[name]
    expected = hwloc_kinds(name)
    if expected is None:
        pytest.skip("no hwloc output was captured with %s" % name)
    kinds = read(root)["cpus"]["kinds"]
    assert [ids_of(kind["cpulist"]) for kind in kinds] == (expected if len(expected) > 1 else [])
    for kind in kinds:
        highest = [raw(root, "sys/devices/system/cpu/cpu%d/cpufreq/cpuinfo_max_freq" % cpu)
                   for cpu in ids_of(kind["cpulist"])]
        assert kind["max_freq_khz"] == max(int(value) for value in highest if value), kind


LSTOPO = shutil.which("lstopo-no-graphics")


@needs(LSTOPO is None, "lstopo-no-graphics (Debian package hwloc) not installed")
@pytest.mark.parametrize("name", [os.path.basename(t)[: -len(".tar.bz2")] for t in TARBALLS])
def test_dump_agrees_with_hwloc(dump_roots, name):
    root = dump_roots[name]
    env = dict(os.environ, HWLOC_FSROOT=root, HWLOC_COMPONENTS="linux,stop")
    result = subprocess.run([LSTOPO, "--of", "xml", "-"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    tree = ElementTree.fromstring(result.stdout)
    hwloc_pus = {int(o.get("os_index")) for o in tree.iter("object") if o.get("type") == "PU"}
    hwloc_nodes = {int(o.get("os_index")) for o in tree.iter("object") if o.get("type") == "NUMANode"}
    # hwloc keeps a package that only holds an allowed memory node; compare those with PUs.
    hwloc_packages = {o.get("os_index") for o in tree.iter("object") if o.get("type") == "Package"
                      and any(child.get("type") == "PU" for child in o.iter("object"))}

    facts = read(root)
    allowed = ids_of(facts["cpus"]["allowed"]) or set(range(1 << 16))
    mems = ids_of(facts["cpus"]["mems_allowed"]) or set(range(1 << 16))
    ours_pus = set().union(*(set(n["cpus"]) for n in facts["nodes"])) & allowed
    assert ours_pus == hwloc_pus or not hwloc_pus
    # hwloc invents one node when the kernel shows none, and discards the NUMA
    # information of a machine whose nodes claim the same CPUs (we warn instead).
    ours_nodes = {n["id"] for n in facts["nodes"] if n["id"] in mems}
    inconsistent = any("firmware NUMA tables are inconsistent" in w for w in facts["warnings"])
    if not inconsistent:
        assert ours_nodes == hwloc_nodes or (not hwloc_nodes and len(ours_nodes) == 1)
    if hwloc_packages and None not in hwloc_packages:
        ours_packages = {p["id"] for p in facts["cpus"]["packages"] if ids_of(p["cpulist"]) & allowed}
        assert {int(p) for p in hwloc_packages} == ours_packages
    for obj in tree.iter("object"):
        if obj.get("type") == "NUMANode" and obj.get("local_memory") and not inconsistent:
            node = next(n for n in facts["nodes"] if n["id"] == int(obj.get("os_index")))
            assert int(obj.get("local_memory")) == node["memory_total_kb"] * 1024


def test_numa_facts_module_ad_hoc_on_every_dump(dump_roots, tmp_path):
    """`ansible localhost -m numa_facts -a root=<dump>` for the whole corpus, in one playbook run."""
    playbook = tmp_path / "all_dumps.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - numa_facts:\n        root: '{{ item }}'\n      loop: %s\n      register: read\n"
        "    - assert:\n        that:\n"
        "          - item.ansible_facts.numa.schema_version == 1\n"
        "          - item.ansible_facts.numa.node_count == (item.ansible_facts.numa.nodes | length)\n"
        "        quiet: true\n      loop: '{{ read.results }}'\n      loop_control:\n        label: '{{ item.item }}'\n"
        % json.dumps(sorted(dump_roots.values()))
    )
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    result = subprocess.run([ansible_command("ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
                             "ansible_python_interpreter=" + sys.executable, str(playbook)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stdout + result.stderr
    assert "failed=0" in result.stdout


@pytest.mark.parametrize("name", [os.path.basename(t)[: -len(".tar.bz2")] for t in TARBALLS])
def test_numa_pin_explain_on_every_dump_plans_or_says_why(dump_roots, name):
    """"What would happen on that box": a sensible plan, or a clear error, never a traceback."""
    root = dump_roots[name]
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "plugins", "module_utils"))
    for extra in ([], ["--instances", "2", "--instance", "1", "--model-size", "4G", "--no-smt"]):
        result = subprocess.run([sys.executable, "-m", "numa", "explain", "--root", root] + extra,
                                capture_output=True, text=True, env=env, timeout=60, check=False)
        assert "Traceback" not in result.stderr
        if result.returncode != 0:
            assert result.returncode == 2 and result.stderr.startswith("numa-pin: "), result.stderr
            continue
        placement = json.loads(result.stdout)
        facts = read(root)
        node_cpus = {n["id"]: set(n["cpus"]) for n in facts["nodes"]}
        assert placement["cpus"] and set(placement["cpus"]) <= set().union(*(node_cpus[n] for n in placement["cpu_nodes"]))
        allowed = ids_of(facts["cpus"]["allowed"])
        assert not allowed or set(placement["cpus"]) <= allowed
        assert placement["threads"] == len(placement["cpus"]) and placement["reasons"]


@pytest.mark.parametrize("name", [os.path.basename(t)[: -len(".tar.bz2")] for t in TARBALLS])
def test_gpu_plans_map_every_gpu_and_cover_the_nodes_they_span(dump_roots, name):
    """All of a dump's GPUs in one instance: a worker per GPU inside the plan, and every GPU node covered."""
    facts = read(dump_roots[name])
    if not facts["gpus"]:
        pytest.skip("no GPU in this dump")
    for engine in ("vllm", "sglang", "trtllm"):
        try:
            result = plan(facts, Request(gpus=len(facts["gpus"]), engine=engine))
        except PlacementError as error:
            assert str(error).strip() and "\n" not in str(error)
            continue
        assert [entry["gpu"] for entry in result.gpu_map] == result.gpus
        for entry in result.gpu_map:
            assert ids_of(entry["cpulist"]) <= set(result.cpus) and set(entry["mem_nodes"]) <= set(result.mem_nodes)
        usable = {node["id"] for node in facts["nodes"] if node["cpus"]}
        local = {gpu["numa_node"] for gpu in facts["gpus"]} & usable
        if len(local) > 1:
            assert local <= set(result.cpu_nodes) and len(result.mem_nodes) > 1, result.reasons
            assert any("span nodes" in reason for reason in result.reasons)


NIC_OR_NVME = (0x0200, 0x0207, 0x0208, 0x0108)  # the facts' NIC classes and NVMe (0x010802's upper bytes)
# The dumps with NICs or NVMe drives on a node of known CPUs, and how many: two NICs and an NVMe drive on node 0 of
# the dual Xeon with DAX and NVMe and its ConnectX-3 HCA on node 1; four NICs of the 2-socket Xeon with eight vector
# engines; the QLogic HCA of the 4-node Xeon (its node read from its local CPUs).
CHECKED_DEVICE_COUNTS = {"32em64t-2n8c+dax+nvme+mic+dimms": 4, "32intel64-2p8co2t+8ve": 4,
                         "40intel64-2g2n4c+pcilocality": 1}


def raw_device_node(root, address):
    """The device's numa_node; where the kernel knows none (-1) on a host of several nodes, the one node whose CPUs
    hold its local_cpulist (on one node, local CPUs say nothing: they are all of them)."""
    node = int(raw(root, "sys/bus/pci/devices/%s/numa_node" % address) or "-1")
    if node >= 0:
        return node
    local = ids_of(raw(root, "sys/bus/pci/devices/%s/local_cpulist" % address))
    names = [name for name in os.listdir(os.path.join(root, "sys/devices/system/node")) if re.match(r"node\d+$", name)]
    holding = [int(name[4:]) for name in names
               if local and local <= ids_of(raw(root, "sys/devices/system/node/%s/cpulist" % name))]
    return holding[0] if len(holding) == 1 and len(names) > 1 else -1


def raw_and_planned_targets(root):
    """An instance on every node with CPUs, each keeping its node's first CPU out (reserve_cpus): the device interrupt
    targets the raw files give each NIC and NVMe drive of a known node (its node's spare CPUs), and irq_targets'."""
    facts = read(root)
    plans = []
    for node in [node for node in facts["nodes"] if node["cpus"]]:
        try:
            placed = plan(facts, Request(node=node["id"], gpus="none", reserve_cpus=str(node["cpus"][0])))
        except PlacementError:
            continue
        plans.append({"cpus": placed.cpus, "gpus": placed.gpus})
    used = set().union(*(set(record["cpus"]) for record in plans)) if plans else set()
    online = online_cpus(root)
    pci_dir = os.path.join(root, "sys/bus/pci/devices")
    expected = {}
    for address in sorted(os.listdir(pci_dir)) if os.path.isdir(pci_dir) else []:
        device_class = int(raw(root, "sys/bus/pci/devices/%s/class" % address) or "0", 16)
        rdma = os.path.isdir(os.path.join(pci_dir, address, "infiniband"))  # a NIC whatever its class
        listed = device_class >> 8 in NIC_OR_NVME and (device_class >> 8 != 0x0108 or device_class & 0xff == 2)
        if not (rdma or listed):
            continue
        node = raw_device_node(root, address)
        node_cpus = ids_of(raw(root, "sys/devices/system/node/node%d/cpulist" % node)) & online if node >= 0 else set()
        if node_cpus & used:
            spare = node_cpus - used - ids_of(facts["cpus"]["isolated"]) - ids_of(facts["cpus"]["nohz_full"])
            expected[address] = (node, tuple(sorted(spare or node_cpus)))
    targets, _reasons = irq_targets(facts, plans)
    return expected, targets


@pytest.mark.parametrize("name", [os.path.basename(t)[: -len(".tar.bz2")] for t in TARBALLS])
def test_device_interrupt_targets_are_their_nodes_spare_cpus_by_raw_sysfs(dump_roots, name):
    expected, targets = raw_and_planned_targets(dump_roots[name])
    assert {target.address: (target.node, target.cpus) for target in targets} == expected
    assert all(target.spare for target in targets), targets  # each node kept its first CPU out


def test_the_dumps_devices_with_interrupts_to_place_are_there_to_check(dump_roots):
    """The test above checks something: the dumps whose NICs or NVMe drives sit on a node of known CPUs."""
    found = {name: len(raw_and_planned_targets(root)[0]) for name, root in dump_roots.items()}
    assert {name: count for name, count in found.items() if count} == CHECKED_DEVICE_COUNTS


def fast_and_all(root):
    """Per node with CPUs: (the CPUs an instance there gets, and those it gets with cores fast); nodes the planner
    refuses are left out."""
    facts = read(root)
    found = {}
    for node in [node for node in facts["nodes"] if node["cpus"]]:
        try:
            found[node["id"]] = (set(plan(facts, Request(node=node["id"], gpus="none")).cpus),
                                 set(plan(facts, Request(node=node["id"], gpus="none", cores="fast")).cpus))
        except PlacementError:
            continue
    return found


@pytest.mark.parametrize("name", [os.path.basename(t)[: -len(".tar.bz2")] for t in TARBALLS])
def test_fast_cores_are_the_fastest_kind_hwloc_found_on_the_node(dump_roots, name):
    """cores fast keeps, of each node's CPUs, those of the fastest CPU kind hwloc told apart among them (and the CPUs
    of no kind, not known to be slower); where hwloc found one kind or none, every CPU."""
    kinds = hwloc_kinds(name)
    if kinds is None:
        pytest.skip("no hwloc output was captured with %s" % name)
    for node, (every, fast) in fast_and_all(dump_roots[name]).items():
        present = [kind & every for kind in kinds if kind & every] if len(kinds) > 1 else []
        slower = set().union(*present[1:]) if present else set()
        assert fast == every - slower, (node, sorted(every), sorted(fast))


def test_the_dumps_fast_cores_leave_a_slower_kind_out_somewhere(dump_roots):
    """The test above checks something: the hybrid laptop's node keeps its 6 P-cores (12 threads), not its 8 E-cores."""
    found = {name: {node: len(every - fast) for node, (every, fast) in fast_and_all(root).items() if every - fast}
             for name, root in dump_roots.items()}
    assert {name: left for name, left in found.items() if left} == {"20em64t-hybrid-1p6c2t+2ca4co1t": {0: 8}}


def raw_pci_chain(root, address):
    """The host bridge and bridges above a PCI device, from its sys/bus/pci/devices link (os.readlink, a regular
    expression); [] when the link names no such path."""
    link = os.path.join(root, "sys/bus/pci/devices", address)
    found = re.search(r"/(pci[0-9a-f]{4,8}:[0-9a-f]{2}(?:/[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])*)$",
                      os.readlink(link)) if os.path.islink(link) else None
    return found.group(1).split("/")[:-1] if found and found.group(1).endswith(address) else []


def raw_nics(root):
    """Every network or RDMA device of a dump, read here: Ethernet, InfiniBand or fabric class, or an infiniband/."""
    pci_dir = os.path.join(root, "sys/bus/pci/devices")
    return [address for address in (sorted(os.listdir(pci_dir)) if os.path.isdir(pci_dir) else [])
            if int(raw(root, "sys/bus/pci/devices/%s/class" % address) or "0", 16) >> 8 in (0x0200, 0x0207, 0x0208)
            or os.path.isdir(os.path.join(pci_dir, address, "infiniband"))]


def raw_nearness(root, gpu, nic, node):
    """How near ``nic`` is to ``gpu`` (its worker on ``node``), as NCCL ranks paths: below a shared PCIe bridge,
    a shared host bridge, the same NUMA node; None when on another node."""
    shared = 0
    for mine, theirs in zip(raw_pci_chain(root, gpu), raw_pci_chain(root, nic)):
        if mine != theirs:
            break
        shared += 1
    if shared > 1:
        return "pcie_switch"
    if shared:
        return "host_bridge"
    return "node" if raw_device_node(root, nic) == node else None


def nic_choices(root):
    """For each GPU of a plan of all the dump's GPUs (vLLM): the NICs it lists, nearest first, each (how near,
    address), and the same from the raw links; {} without GPUs or a plan."""
    facts = read(root)
    if not facts["gpus"]:
        return {}
    try:
        placed = plan(facts, Request(gpus=len(facts["gpus"]), engine="vllm"))
    except PlacementError:
        return {}
    order = ("pcie_switch", "host_bridge", "node")
    return {entry["gpu"]: ([(nic["near"], nic["address"]) for nic in entry["nics"]],
                           sorted(((near, nic) for nic in raw_nics(root)
                                   for near in [raw_nearness(root, entry["gpu"], nic, entry["node"])] if near),
                                  key=lambda pair: (order.index(pair[0]), pair[1])))
            for entry in placed.gpu_map}


@pytest.mark.parametrize("name", [os.path.basename(t)[: -len(".tar.bz2")] for t in TARBALLS])
def test_each_gpus_nics_are_the_nearest_by_the_raw_pci_links(dump_roots, name):
    for gpu, (planned, expected) in nic_choices(dump_roots[name]).items():
        assert planned == expected, gpu


def test_the_dumps_gpus_with_a_nic_near_them_are_there_to_check(dump_roots):
    """The test above checks something: the dumps with a GPU and a NIC near it, and how many such pairs."""
    found = {name: sum(len(expected) for _planned, expected in nic_choices(root).values())
             for name, root in dump_roots.items()}
    assert {name: pairs for name, pairs in found.items() if pairs} == {"2pa-pcidomain32bits": 1}
