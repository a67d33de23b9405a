"""numa_irqs: the servers' device interrupts on their nodes' spare CPUs, the table kept for boot and irqbalance, and
what was there put back when a device no longer follows a plan."""

import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import device_irqs, knobs
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.device_irqs import (
    IrqTarget, instance_targets, irq_targets, parse_table, table_text)
from ansible_collections.inferops.numa.plugins.module_utils.numa.cli import numa_pin
from ansible_collections.inferops.numa.plugins.module_utils.numa.measure import ab_gate
from ansible_collections.inferops.numa.plugins.module_utils.numa.watch import exposition, metrics
from ansible_collections.inferops.numa.plugins.modules import numa_audit, numa_irqs
from tests.ansible_compat import patch_module_args
from tests.fixtures import sysfs
from tests.unit.test_audit import write_process
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
    assert parse_table(table_text(targets, "numa_irqs")) == targets
    assert table_text([], "numa_irqs") is None
    for line in ("../../etc/passwd 1 nic 1 spare", "%s" % NIC1, "%s 1 nic x spare" % NIC1, "%s x nic 1 spare" % NIC1,
                 "%s 1 disk 1 spare" % NIC1, "%s 1 nic 1 maybe" % NIC1, "%s 1 nic 1 spare extra" % NIC1):
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
    assert parse_table(read(root, device_irqs.TABLE_PATH)) == targets
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


# ---------------------------------------------------------------- the audit

NIC1_IRQS, NIC0_IRQS, GPU1_IRQS = (45, 46, 47), (30, 31), (50, 51)
ON_NODE_1 = [IrqTarget(NIC0, "nic", 0, (2, 3), True), IrqTarget(NIC1, "nic", 1, (6, 7), True),
             IrqTarget(GPU1, "gpu", 1, (6, 7), True)]


def test_an_instance_owns_its_gpus_and_the_nics_and_drives_of_its_nodes():
    assert instance_targets(ON_NODE_1, {"cpu_nodes": [1], "gpus": [GPU1]}) == ON_NODE_1[1:]
    assert instance_targets(ON_NODE_1, {"cpu_nodes": [1], "gpus": []}) == ON_NODE_1[1:2]  # another's GPU
    assert instance_targets(ON_NODE_1, {"cpu_nodes": [0, 1], "gpu_map": [{"gpu": GPU1}]}) == ON_NODE_1
    assert instance_targets(ON_NODE_1, {"cpu_nodes": "1", "gpus": [GPU1]}) == ON_NODE_1[2:]  # not a record's nodes


def applied_host(tmp_path):
    root = host(tmp_path, devices=((NIC1, NIC1_IRQS), (NIC0, NIC0_IRQS), (GPU1, GPU1_IRQS)))
    device_irqs.apply(device_irqs.make_plan(root, ON_NODE_1, "/usr/bin/numa-pin"), no_systemd)
    return root


def passed(unit="llama@1.service"):
    return {"ok": True, "msg": "%s: PID(s) 4242: 1.0 GiB resident" % unit, "processes": [{"pid": 4242}],
            "warnings": []}


def test_the_audit_fails_an_instance_whose_device_interrupt_was_moved_off_its_cpus(tmp_path):
    root = applied_host(tmp_path)
    mine = {"policy": "bind", "cpu_nodes": [1], "gpus": [GPU1]}
    audited = device_irqs.audit_interrupts(passed(), root, mine)
    assert audited["ok"] and audited["device_irqs"] == [
        {"device": NIC1, "kind": "nic", "cpus": "6-7", "interrupts": 3, "outside": 0},
        {"device": GPU1, "kind": "gpu", "cpus": "6-7", "interrupts": 2, "outside": 0}]
    write(root, "proc/irq/46/smp_affinity_list", "0-7\n")  # irqbalance without the script, say
    write(root, "proc/irq/30/smp_affinity_list", "4\n")  # node 0's NIC: the node-1 instance's audit ignores it
    audited = device_irqs.audit_interrupts(passed(), root, mine)
    assert not audited["ok"] and [entry["outside"] for entry in audited["device_irqs"]] == [1, 0]
    assert audited["msg"].startswith("llama@1.service: PID(s) 4242: 1.0 GiB resident. FAILED: nic %s: interrupt(s) "
                                     "46 served on CPUs 0-7, not its 6-7 in %s; something moved them back"
                                     % (NIC1, device_irqs.TABLE_PATH)), audited["msg"]
    already = dict(passed(), ok=False, msg="llama@1.service: ... FAILED: 12.00% local")
    assert device_irqs.audit_interrupts(already, root, mine)["msg"].startswith(
        "llama@1.service: ... FAILED: 12.00%% local; nic %s: interrupt(s) 46" % NIC1)


def test_the_audit_leaves_the_interrupts_alone_without_a_plan_or_a_table_and_warns_on_one_it_cannot_trust(tmp_path):
    root = applied_host(tmp_path)
    write(root, "proc/irq/46/smp_affinity_list", "0-7\n")
    assert device_irqs.audit_interrupts(passed(), root, None) == passed()
    failed_early = {"unit": "llama@1.service", "ok": False, "msg": "not running", "warnings": []}
    assert device_irqs.audit_interrupts(dict(failed_early), root, {"cpu_nodes": [1]}) == failed_early
    bare = host(tmp_path / "bare", devices=((NIC1, NIC1_IRQS),))
    assert device_irqs.audit_interrupts(passed(), bare, {"cpu_nodes": [1]}) == passed()
    assert device_irqs.audit_interrupts(passed(), root, {"cpu_nodes": []}) == dict(passed(), device_irqs=[])
    os.chmod(os.path.join(root, device_irqs.TABLE_PATH.lstrip("/")), 0o666)
    untrusted = device_irqs.audit_interrupts(passed(), root, {"cpu_nodes": [1]})
    assert untrusted["ok"] and "device_irqs" not in untrusted
    assert any("device interrupts not audited" in w and "device-irqs.conf" in w for w in untrusted["warnings"])


def test_the_audit_module_fails_a_placed_process_whose_nic_interrupt_moved(tmp_path, capsys):
    root = applied_host(tmp_path)
    write_process(root, 4242, "7f3a10000000 bind:1 anon=65536 dirty=65536 N1=65536 kernelpagesize_kB=4\n",
                  [(4242, "6-7", 6)])
    mine = {"policy": "bind", "node": 1, "mem_nodes": [1], "cpu_nodes": [1], "cpus": [6, 7], "gpus": []}

    def audit():
        with patch_module_args({"pids": [4242], "plan": mine, "root": root}):
            with pytest.raises(SystemExit):
                numa_audit.main()
        return json.loads(capsys.readouterr().out)
    assert audit()["ok"] is True
    write(root, "proc/irq/47/smp_affinity_list", "2\n")
    result = audit()
    assert result["failed"] and result["device_irqs"][0]["outside"] == 1
    assert "interrupt(s) 47 served on CPUs 2, not its 6-7" in result["msg"]


# ---------------------------------------------------------------- the A/B gate


GATE = ab_gate.gate_from({"rounds": 3, "max_rounds": 3}, 8080, "llama.cpp")


def measured(*sets):
    """A rates function answering each measurement with the next set of rounds, and the calls it saw."""
    answers = list(sets)

    def rates(gate):
        assert gate is GATE
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer
    return rates


def test_a_change_the_gate_finds_no_slower_is_kept_with_its_verdict(tmp_path):
    root = host(tmp_path)
    planned = device_irqs.make_plan(root, [IrqTarget(NIC1, "nic", 1, (6, 7), True)], "/usr/bin/numa-pin")
    managed, verdicts, rolled_back = device_irqs.apply_gated(planned, [("llama@1.service", GATE)], no_systemd,
                                                             measured([10.0, 10.1, 9.9], [10.4, 10.5, 10.3]))
    assert not rolled_back and verdicts["llama@1.service"]["kept"] and managed == []
    assert affinities(root, (45, 46, 47)) == ["6-7"] * 3


def test_a_change_the_gate_finds_slower_is_rolled_back_recorded_and_not_tried_again(tmp_path):
    root = host(tmp_path, affinity="0-3")
    first = [IrqTarget(NIC1, "nic", 1, (4, 5), True)]
    device_irqs.apply(device_irqs.make_plan(root, first, "/usr/bin/numa-pin"), no_systemd)
    moved = [IrqTarget(NIC1, "nic", 1, (6, 7), True)]
    planned = device_irqs.make_plan(root, moved, "/usr/bin/numa-pin")
    _managed, verdicts, rolled_back = device_irqs.apply_gated(planned, [("llama@1.service", GATE)], no_systemd,
                                                              measured([10.0, 10.1, 9.9], [7.0, 7.1, 6.9]))
    assert rolled_back and not verdicts["llama@1.service"]["kept"]
    assert affinities(root, (45, 46, 47)) == ["4-5"] * 3 and device_irqs.read_table(root) == first
    record = device_irqs.rejected(root)
    assert parse_table(record["table"]) == moved and parse_table(record["previous"]) == first
    assert "llama@1.service: 10.00 -> 7.00 tokens/s" in record["verdict"]
    result = device_irqs.result(planned, False, [], verdicts, rolled_back)
    assert result["rolled_back"] and result["msg"].startswith("rolled back, slower by the A/B gate: llama@1.service")
    # Everything taken back (state absent): the rejected record goes too.
    device_irqs.apply(device_irqs.make_plan(root, [], "/usr/bin/numa-pin"), no_systemd)
    assert knobs.forget(root, device_irqs.REJECTED_PATH, check=True) and device_irqs.rejected(root) is not None
    assert knobs.forget(root, device_irqs.REJECTED_PATH, check=False) and not knobs.forget(
        root, device_irqs.REJECTED_PATH, check=False)
    assert device_irqs.rejected(root) is None and affinities(root, (45, 46, 47)) == ["0-3"] * 3


def test_a_first_change_rolled_back_leaves_nothing_of_it(tmp_path):
    root = host(tmp_path, affinity="1")
    planned = device_irqs.make_plan(root, [IrqTarget(NIC1, "nic", 1, (6,), True)], "/usr/bin/numa-pin")
    device_irqs.apply_gated(planned, [("llama@1.service", GATE)], no_systemd, measured([10.0] * 3, [5.0] * 3))
    assert affinities(root, (45, 46, 47)) == ["1"] * 3
    for path in list(device_irqs.support_texts("/usr/bin/numa-pin")) + [device_irqs.TABLE_PATH]:
        assert read(root, path) is None, path
    assert parse_table(device_irqs.rejected(root)["table"]) == list(planned.targets)


def test_an_instance_that_cannot_be_measured_changes_nothing_before_and_takes_the_change_back_after(tmp_path):
    root = host(tmp_path, affinity="1")
    planned = device_irqs.make_plan(root, [IrqTarget(NIC1, "nic", 1, (6,), True)], "/usr/bin/numa-pin")
    with pytest.raises(NumaError, match="cannot measure the tokens/s of llama@1.service before the change; nothing "
                                        "was changed: refused"):
        device_irqs.apply_gated(planned, [("llama@1.service", GATE)], no_systemd, measured(NumaError("refused")))
    assert affinities(root, (45, 46, 47)) == ["1"] * 3 and read(root, device_irqs.TABLE_PATH) is None
    with pytest.raises(NumaError, match="after the change: timed out; the interrupts were put back as they were"):
        device_irqs.apply_gated(planned, [("llama@1.service", GATE)], no_systemd,
                                measured([10.0] * 3, NumaError("timed out")))
    assert affinities(root, (45, 46, 47)) == ["1"] * 3 and read(root, device_irqs.TABLE_PATH) is None


def test_a_rejected_record_root_did_not_write_alone_is_refused(tmp_path):
    root = host(tmp_path)
    os.makedirs(os.path.join(root, "etc/inferops-numa"))
    path = os.path.join(root, device_irqs.REJECTED_PATH.lstrip("/"))
    write(root, device_irqs.REJECTED_PATH.lstrip("/"), '{"table": "x"}')
    os.chmod(path, 0o600)
    with pytest.raises(NumaError, match="is not the A/B gate's record numa_irqs writes; remove it"):
        device_irqs.rejected(root)
    os.chmod(path, 0o666)
    with pytest.raises(NumaError, match="refusing to use .*device-irqs.rejected"):
        device_irqs.rejected(root)


# ---------------------------------------------------------------- the module's choice on a host


def test_the_module_reads_the_hosts_plans_and_keeps_a_table_the_gate_rolled_back(tmp_path, trusted_dir):
    root = sysfs.dual_socket_gpus().write(str(tmp_path / "machine"))
    plans = os.path.join(trusted_dir, "plans")
    os.mkdir(plans, 0o755)
    record = {"policy": "bind", "mem_nodes": [1], "cpulist": "41-79", "cpus": list(range(41, 80)),
              "gpus": ["0000:81:00.0"]}
    with open(os.path.join(plans, "llama@0.plan.json"), "w") as handle:
        json.dump(record, handle)
    with open(os.path.join(plans, "broken@0.plan.json"), "w") as handle:
        json.dump({"policy": "bind", "cpus": "all"}, handle)
    targets, reasons = numa_irqs.wanted(root, plans)
    spare = tuple([40] + list(range(120, 160)))  # node 1 less the instance's CPUs
    assert [(target.address, target.cpus) for target in targets] == [("0000:41:00.0", spare),
                                                                     ("0000:81:00.0", spare)]
    assert len(reasons) == 1 and "broken@0.plan.json" in reasons[0]  # a record not as the role writes it is left out
    os.makedirs(os.path.join(root, "etc/inferops-numa"))
    write(root, device_irqs.REJECTED_PATH.lstrip("/"), json.dumps(
        {"table": table_text(targets, device_irqs.OWNER), "previous": None, "verdict": "llama@0.service: slower"}))
    os.chmod(os.path.join(root, device_irqs.REJECTED_PATH.lstrip("/")), 0o600)
    kept, why = numa_irqs.wanted(root, plans)
    assert kept == [] and "the A/B gate rolled back this table before (llama@0.service: slower)" in why[-1]


@pytest.mark.parametrize("entry, message", [
    ({"port": 8080}, "each entry needs a unit"),
    ({"unit": "x@0.service", "engine": "ollama?", "port": 8080}, "each entry needs a unit and an engine of"),
    ({"unit": "x@0.service", "engine": "llama.cpp"}, "x@0.service: ab_gate needs the instance's port"),
    ({"unit": "x@0.service", "port": 8080, "ab_gate": {"rounds": 0}}, "x@0.service: ab_gate rounds: 0 is not"),
])
def test_a_gate_entry_the_gate_cannot_use_is_refused_before_any_change(entry, message):
    with pytest.raises(NumaError, match=message):
        ab_gate.gated_instances([entry], 600.0)
    assert ab_gate.gated_instances([{"unit": "x@0.service", "port": 8080, "engine": "vllm", "record": "/x",
                                     "ab_gate": {"rounds": 2}}], 60.0)[0][1].api == "openai"


def test_a_garbage_default_affinity_is_one_line_naming_the_file_not_its_bytes(tmp_path):
    root = host(tmp_path, default="\x1b[31mzz")
    device_irqs.apply(device_irqs.make_plan(root, [IrqTarget(NIC1, "nic", 1, (6,), True)], "/usr/bin/numa-pin"),
                      no_systemd)
    with pytest.raises(NumaError, match=r"default_smp_affinity does not hold a CPU mask") as caught:
        device_irqs.make_plan(root, [], "/usr/bin/numa-pin")
    assert "zz" not in str(caught.value) and "\n" not in str(caught.value)
