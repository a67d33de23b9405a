"""numa_irqs: the servers' device interrupts on their nodes' spare CPUs, the table kept for boot and irqbalance, and
what was there put back when a device no longer follows a plan."""

import os

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import device_irqs, knobs
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.device_irqs import (IrqTarget, irq_targets,
                                                                                           parse_table, table_text)
from ansible_collections.inferops.numa.plugins.module_utils.numa.cli import numa_pin
from ansible_collections.inferops.numa.plugins.module_utils.numa.watch import exposition, metrics
from tests.unit.topo_factory import dgx_switches, make_gpu, make_nic, make_node, make_topology

NIC1, NIC0, GPU1 = "0000:81:00.0", "0000:41:00.0", "0000:82:00.0"


def two_nodes(**overrides):
    """Node 0: CPUs 0-3, node 1: CPUs 4-7; a NIC on each node and a GPU on node 1."""
    nodes = [make_node(0, [0, 1, 2, 3], packages=[0]), make_node(1, [4, 5, 6, 7], packages=[1])]
    return make_topology(nodes, gpus=[make_gpu(GPU1, 1)], nics=[make_nic(NIC0, 0, "eth0"), make_nic(NIC1, 1, "eth1")],
                         **overrides)


def plan(cpus, gpus=()):
    return {"policy": "bind", "cpus": list(cpus), "gpus": list(gpus)}


# ---------------------------------------------------------------- deciding


def test_a_nodes_devices_go_to_the_cpus_no_server_runs_on():
    targets, reasons = irq_targets(two_nodes(), [plan([4, 5, 6])])
    assert targets == [IrqTarget(NIC1, "nic", 1, (7,), True)]  # node 0 serves no plan: its NIC is not ours
    assert reasons == []


def test_a_full_node_shares_its_cpus_and_says_so_a_plans_gpu_is_its_own():
    targets, reasons = irq_targets(two_nodes(), [plan([4, 5, 6, 7], [GPU1]), plan([0, 1])])
    assert targets == [IrqTarget(NIC0, "nic", 0, (2, 3), True), IrqTarget(NIC1, "nic", 1, (4, 5, 6, 7), False),
                       IrqTarget(GPU1, "gpu", 1, (4, 5, 6, 7), False)]
    assert reasons == ["nic %s: every CPU of node 1 runs a server, its interrupts share them (4-7)" % NIC1,
                       "gpu %s: every CPU of node 1 runs a server, its interrupts share them (4-7)" % GPU1]


def test_isolated_cpus_are_never_targets_and_an_unknown_node_is_left_alone():
    topology = two_nodes()
    topology["cpus"]["isolated"] = "7"
    topology["nics"].append(make_nic("0000:c1:00.0", None, "eth2"))
    targets, reasons = irq_targets(topology, [plan([4, 5], [GPU1])])
    assert [target.cpus for target in targets] == [(6,), (6,)]
    gpu_only = irq_targets(topology, [plan([0], ["0000:c1:00.0"])])  # a plan naming a device of no node
    assert gpu_only[0] == [IrqTarget(NIC0, "nic", 0, (1, 2, 3), True)]


def test_the_dgx_boards_devices_per_socket():
    topology = dgx_switches()
    socket1 = [cpu for cpu in topology["nodes"][1]["cpus"] if cpu not in (56, 168)]
    targets, _reasons = irq_targets(topology, [plan(socket1, [topology["gpus"][4]["address"]])])
    assert {target.address for target in targets} == {topology["gpus"][4]["address"]} | {
        nic["address"] for nic in topology["nics"] if nic["numa_node"] == 1}
    assert {target.cpus for target in targets} == {(56, 168)}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sets(st.integers(0, 7), max_size=8), max_size=3), st.sets(st.integers(0, 7), max_size=3))
def test_targets_are_always_on_the_devices_node_and_off_busy_cpus_when_it_has_spare_ones(plans, isolated):
    topology = two_nodes()
    topology["cpus"]["isolated"] = ",".join(map(str, sorted(isolated)))
    records = [plan(sorted(cpus)) for cpus in plans]
    busy = set().union(*plans) if plans else set()
    targets, _reasons = irq_targets(topology, records)
    node_cpus = {node["id"]: set(node["cpus"]) for node in topology["nodes"]}
    for target in targets:
        assert set(target.cpus) <= node_cpus[target.node]
        assert target.spare == bool(node_cpus[target.node] - busy - isolated)
        if target.spare:
            assert not set(target.cpus) & (busy | isolated)
    assert {target.node for target in targets if target.kind == "nic"} == {
        node for node, cpus in node_cpus.items() if cpus & busy}


def test_the_table_reads_back_and_refuses_what_it_never_writes():
    targets = [IrqTarget(NIC1, "nic", 1, (6, 7), True), IrqTarget(GPU1, "gpu", 1, (4, 5, 6, 7), False)]
    assert parse_table(table_text(targets, "numa_irqs")) == {NIC1: (6, 7), GPU1: (4, 5, 6, 7)}
    assert table_text([], "numa_irqs") is None
    for line in ("../../etc/passwd 1", "%s" % NIC1, "%s 1 2" % NIC1, "%s x" % NIC1):
        with pytest.raises(NumaError, match="line 1"):
            parse_table(line + "\n")


# ---------------------------------------------------------------- acting on a host tree


def host(tmp_path, devices=((NIC1, (45, 46, 47)),), affinity="0-7", default="ff"):
    """A root with each device's MSI interrupts (sysfs msi_irqs) and their /proc/irq affinity files."""
    root = str(tmp_path / "root")
    os.makedirs(os.path.join(root, "proc/irq"))
    write(root, "proc/irq/default_smp_affinity", default + "\n")
    for address, irqs in devices:
        os.makedirs(os.path.join(root, "sys/bus/pci/devices", address, "msi_irqs"))
        for irq in irqs:
            write(root, "sys/bus/pci/devices/%s/msi_irqs/%d" % (address, irq), "msix\n")
            os.makedirs(os.path.join(root, "proc/irq/%d" % irq))
            write(root, "proc/irq/%d/smp_affinity_list" % irq, affinity + "\n")
    return root


def write(root, path, text):
    with open(os.path.join(root, path), "w") as handle:
        handle.write(text)


def read(root, path):
    full = os.path.join(root, path.lstrip("/"))
    return open(full).read() if os.path.exists(full) else None


def affinities(root, irqs):
    return [read(root, "proc/irq/%d/smp_affinity_list" % irq).strip() for irq in irqs]


def no_systemd(argv):
    raise AssertionError("a test root never reaches systemctl: %s" % argv)


def test_a_device_follows_its_plan_is_kept_for_boot_and_banned_for_irqbalance(tmp_path):
    root = host(tmp_path)
    targets = [IrqTarget(NIC1, "nic", 1, (6, 7), True)]
    planned = device_irqs.make_plan(root, targets, "/usr/local/bin/numa-pin")
    assert affinities(root, (45, 46, 47)) == ["0-7"] * 3  # planning writes nothing
    assert device_irqs.apply(planned, no_systemd) == []
    assert affinities(root, (45, 46, 47)) == ["6-7"] * 3
    assert parse_table(read(root, device_irqs.TABLE_PATH)) == {NIC1: (6, 7)}
    assert "ExecStart=/usr/local/bin/numa-pin irqs" in read(root, "/etc/systemd/system/" + device_irqs.BOOT_UNIT)
    assert "--policyscript=" + device_irqs.POLICY_PATH in read(
        root, "/etc/systemd/system/irqbalance.service.d/60-inferops-numa.conf")
    assert not device_irqs.make_plan(root, targets, "/usr/local/bin/numa-pin").changed


def test_a_device_leaving_gets_its_recorded_affinity_back_and_the_last_removes_every_file(tmp_path):
    root = host(tmp_path, devices=((NIC1, (45, 46)), (NIC0, (30,))), affinity="3")
    both = [IrqTarget(NIC0, "nic", 0, (1,), True), IrqTarget(NIC1, "nic", 1, (6, 7), True)]
    device_irqs.apply(device_irqs.make_plan(root, both, "/usr/bin/numa-pin"), no_systemd)
    assert affinities(root, (30, 45, 46)) == ["1", "6-7", "6-7"]
    shrunk = device_irqs.make_plan(root, both[1:], "/usr/bin/numa-pin")
    assert shrunk.leaving == (NIC0,)
    device_irqs.apply(shrunk, no_systemd)
    assert affinities(root, (30, 45, 46)) == ["3", "6-7", "6-7"]
    gone = device_irqs.make_plan(root, [], "/usr/bin/numa-pin")
    device_irqs.apply(gone, no_systemd)
    assert affinities(root, (30, 45, 46)) == ["3", "3", "3"]
    for path in list(device_irqs.support_texts("/usr/bin/numa-pin")) + [device_irqs.TABLE_PATH]:
        assert read(root, path) is None, path
    assert knobs.read_originals(root, device_irqs.KNOB) == (None, None)


def test_an_interrupt_renumbered_since_the_record_gets_the_kernels_default(tmp_path):
    root = host(tmp_path, affinity="2")
    device_irqs.apply(device_irqs.make_plan(root, [IrqTarget(NIC1, "nic", 1, (6,), True)], "/usr/bin/numa-pin"),
                      no_systemd)
    os.rename(os.path.join(root, "sys/bus/pci/devices", NIC1, "msi_irqs/47"),
              os.path.join(root, "sys/bus/pci/devices", NIC1, "msi_irqs/48"))
    os.makedirs(os.path.join(root, "proc/irq/48"))
    write(root, "proc/irq/48/smp_affinity_list", "6\n")
    device_irqs.apply(device_irqs.make_plan(root, [], "/usr/bin/numa-pin"), no_systemd)
    assert affinities(root, (45, 46, 48)) == ["2", "2", "0-7"]  # default_smp_affinity ff


def test_boot_applies_the_table_to_the_interrupts_of_this_boot(tmp_path, capsys):
    root = host(tmp_path)
    device_irqs.apply(device_irqs.make_plan(root, [IrqTarget(NIC1, "nic", 1, (5,), True)], "/usr/bin/numa-pin"),
                      no_systemd)
    for irq in (45, 46, 47):
        write(root, "proc/irq/%d/smp_affinity_list" % irq, "0-7\n")  # a reboot: the kernel's default again
    assert numa_pin.main(["irqs", "--root", root]) == 0
    assert affinities(root, (45, 46, 47)) == ["5"] * 3
    assert capsys.readouterr().out.splitlines() == ["%s irq%d -> 5" % (NIC1, irq) for irq in (45, 46, 47)]


def test_a_planted_table_or_a_device_without_msi_is_refused_or_named(tmp_path, capsys):
    root = host(tmp_path, devices=((NIC1, ()),))
    planned = device_irqs.make_plan(root, [IrqTarget(NIC1, "nic", 1, (5,), True)], "/usr/bin/numa-pin")
    assert planned.knob.settings == () and "no MSI interrupts" in planned.knob.reasons[0]
    os.makedirs(os.path.join(root, "etc/inferops-numa"))
    os.symlink("/etc/passwd", os.path.join(root, device_irqs.TABLE_PATH.lstrip("/")))
    with pytest.raises(NumaError, match="refusing to use .*device-irqs.conf: a symlink"):
        device_irqs.read_table(root)
    assert numa_pin.main(["irqs", "--root", root]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("numa_pin_path", ["numa-pin", "/usr/bin/numa pin", "/x;rm", "/a/%n"])
def test_a_numa_pin_path_systemd_would_misread_is_refused(tmp_path, numa_pin_path):
    with pytest.raises(NumaError, match="numa_host_helper_path"):
        device_irqs.make_plan(host(tmp_path), [], numa_pin_path)


def test_a_running_irqbalance_without_the_script_fails_naming_the_setting():
    def systemctl(argv):
        return 0, "4242\n", ""
    with pytest.raises(NumaError, match="IRQBALANCE_ARGS in its environment file"):
        device_irqs.check_irqbalance(systemctl, lambda path: b"/usr/sbin/irqbalance\0--foreground\0")
    device_irqs.check_irqbalance(systemctl, lambda path: (
        "/usr/sbin/irqbalance\0--foreground\0--policyscript=%s\0" % device_irqs.POLICY_PATH).encode())


def test_the_metrics_count_each_devices_interrupts_served_outside_its_cpus(tmp_path):
    root = host(tmp_path)
    device_irqs.apply(device_irqs.make_plan(root, [IrqTarget(NIC1, "nic", 1, (6, 7), True)], "/usr/bin/numa-pin"),
                      no_systemd)
    write(root, "proc/irq/46/smp_affinity_list", "0-7\n")  # another tool moved one back
    snap = metrics.collect(root, str(tmp_path / "no-plans"), no_systemd, topology=two_nodes(), clock=lambda: 1.0)
    assert snap["host"]["device_irqs"] == [{"device": NIC1, "cpus": "6-7", "interrupts": 3, "outside": 1}]
    text = exposition.render(snap)
    assert 'inferops_numa_device_interrupts{cpus="6-7",device="%s"} 3\n' % NIC1 in text
    assert 'inferops_numa_device_interrupts_outside{cpus="6-7",device="%s"} 1\n' % NIC1 in text
    os.chmod(os.path.join(root, device_irqs.TABLE_PATH.lstrip("/")), 0o666)  # a table anyone could have written
    untrusted = metrics.collect(root, str(tmp_path / "no-plans"), no_systemd, topology=two_nodes())
    assert untrusted["host"]["device_irqs"] == [] and any("device-irqs.conf" in w for w in untrusted["warnings"])
