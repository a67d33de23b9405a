"""Serve the interrupts of the inference servers' devices on their nodes (decide/device_irqs), beside irqbalance,
at every boot, and put back what was there when they no longer follow a plan.

A knob on act/knobs' shape: the runtime files are ``/proc/irq/<N>/smp_affinity_list``, one per MSI/MSI-X interrupt
of each device (``/sys/bus/pci/devices/<address>/msi_irqs``); the drop-in is the table of devices and CPUs
(``TABLE_PATH``). Interrupt numbers are handed out at each driver probe, so the table names devices, not numbers,
and three files of the host act on it:

- the boot unit ``inferops-numa-irqs.service`` (wanted by multi-user.target through a drop-in, a regular file) runs
  ``numa-pin irqs``, which applies the table to whatever numbers the devices have then;
- irqbalance, which moves every interrupt it is not told to leave, runs with a policy script (``--policyscript``, set
  in a drop-in of irqbalance.service) that bans the table's devices: it balances the rest, and leaves ours, and is
  restarted to read the table again whenever it changes; a running irqbalance without the script fails the run
  rather than fight over the same files every ten seconds;
- the table itself.

A device no longer in the table gets back the affinity recorded before the first change (knobs' originals, per
interrupt), else the kernel's default (``/proc/irq/default_smp_affinity``), and irqbalance balances it again. An
interrupt whose affinity the kernel manages itself (the per-queue vectors of NVMe and virtio-blk: writing its file
fails with EIO) is left to the kernel and named.
"""

from __future__ import annotations

import errno
import os
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from . import knobs
from ..base.cpulist import format_cpulist, is_pci_address, parse_cpulist
from ..base.errors import NumaError, shown
from ..decide.device_irqs import IrqTarget, instance_targets, parse_table, table_text
from ..decide.records import PLAN_SUFFIX, REDEPLOY, plan_problem
from ..measure import ab_gate
from ..read.kernel_files import Root
from ..read.systemctl import CommandRunner
from ..system import trusted_files
from ..system.root_files import DROPIN_MODE, host_path, write_under

OWNER = "numa_irqs"
TABLE_PATH = "/etc/inferops-numa/device-irqs.conf"
POLICY_PATH = "/etc/inferops-numa/irqbalance-policy"
# The table the A/B gate rolled back, the one before it and why (``rejected``).
REJECTED_PATH = "/etc/inferops-numa/device-irqs.rejected"
BOOT_UNIT = "inferops-numa-irqs.service"
IRQBALANCE_UNIT = "irqbalance.service"
KNOB = knobs.Knob(OWNER, "/proc/irq", TABLE_PATH,
                  "something moved them back: irqbalance without the collection's policy script, tuned's irqbalance "
                  "or scheduler plugin, or another IRQ tuner; stop it or leave these devices to it")
DEFAULT_AFFINITY = "/proc/irq/default_smp_affinity"
PCI_DEVICES = "sys/bus/pci/devices"
SCRIPT_MODE = 0o755


class SupportFile(NamedTuple):
    """A file the table needs while it lists any device, removed with the last one."""

    path: str  # root-relative
    before: Optional[str]  # None: absent, or not a file to trust as it is
    after: Optional[str]
    mode: int
    flaw: Optional[str]  # why it is rewritten although its text is right

    @property
    def changed(self) -> bool:
        return self.before != self.after or (self.after is not None and self.flaw is not None)


class IrqPlan(NamedTuple):
    knob: knobs.KnobPlan  # the affinities (targets', then leaving devices' put back) and the table
    targets: Tuple[IrqTarget, ...]
    leaving: Tuple[str, ...]  # devices the table lists now and the plans no longer do
    files: Tuple[SupportFile, ...]
    interrupts: Dict[str, Tuple[int, ...]]  # each device's MSI interrupts now
    previous: Tuple[IrqTarget, ...]  # the table before: what a rollback writes again
    numa_pin: str

    @property
    def changed(self) -> bool:
        return self.knob.changed or any(item.changed for item in self.files)

    @property
    def units_changed(self) -> bool:
        return any(item.changed for item in self.files if item.path.startswith("/etc/systemd/"))


# ---------------------------------------------------------------- reading


def plan_records(plan_dir: str) -> Tuple[List[Dict[str, Any]], List[str]]:
    """Every plan record of the host's instances, and why one was left out (one root cannot trust, or not as the role
    writes it: its devices then follow no plan)."""
    directory = trusted_files.open_plan_directory(plan_dir)
    if directory is None:
        return [], []
    plans, warnings = [], []
    try:
        for name in sorted(name for name in os.listdir(directory) if name.endswith(PLAN_SUFFIX)):
            path = os.path.join(plan_dir, name)
            try:
                written = trusted_files.read_trusted_json(directory, name, path, REDEPLOY)[0]
            except NumaError as exc:
                warnings.append(str(exc))
                continue
            problem = plan_problem(written)
            if problem:
                warnings.append("ignoring %s: %s; %s" % (path, problem, REDEPLOY))
            else:
                plans.append(written)
    finally:
        os.close(directory)
    return plans, warnings


def device_interrupts(root: str, address: str) -> Tuple[int, ...]:
    """The MSI/MSI-X interrupts of the PCI device ``address``; () when it has none (no driver bound, or a legacy
    INTx line, which other devices share: moving it would move theirs)."""
    if not is_pci_address(address):
        raise NumaError("%r is not a PCI address" % address)
    with Root(root) as tree:
        try:
            names = tree.listdir("%s/%s/msi_irqs" % (PCI_DEVICES, address))
        except OSError:
            return ()
    return tuple(sorted(int(name) for name in names if name.isdigit() and len(name) <= 9))


def default_affinity(root: str) -> str:
    """The kernel's default affinity for new interrupts, as a CPU list (the file is a hex mask, words of 32 bits
    separated by commas, most significant first)."""
    mask = knobs.read_value(root, "default_smp_affinity", DEFAULT_AFFINITY) or ""
    try:
        value = int(mask.replace(",", ""), 16)
    except ValueError:
        raise NumaError("%s does not hold a CPU mask: check that /proc is the kernel's (procfs mounted there)"
                        % host_path(root, DEFAULT_AFFINITY)) from None
    return format_cpulist(cpu for cpu in range(value.bit_length()) if value >> cpu & 1)


def read_table(root: str) -> List[IrqTarget]:
    """The devices the table lists now ([] without one); refused when it cannot be trusted."""
    text = knobs.read_trusted(root, KNOB)
    if text is None:
        return []
    try:
        return parse_table(text)
    except NumaError as exc:
        raise NumaError("%s: %s; remove it, %s writes it again" % (host_path(root, TABLE_PATH), exc, OWNER)) from None


def rejected(root: str) -> Optional[Dict[str, Any]]:
    """The A/B gate's last rollback ({"table", "previous", "verdict"}: the table it rolled back, the one before and
    why), None when there was none; refused when the record cannot be trusted."""
    return knobs.read_rejected(root, REJECTED_PATH, OWNER, _is_rejected_record)


def _is_rejected_record(record: Dict[str, Any]) -> bool:
    parse_table(record["table"])  # NumaError for a table numa_irqs would not write
    parse_table(record["previous"] or "")
    return isinstance(record["verdict"], str)


# ---------------------------------------------------------------- planning


def make_plan(root: str, targets: Sequence[IrqTarget], numa_pin: str, reasons: Sequence[str] = ()) -> IrqPlan:
    """What to write so the targets' interrupts are served on their CPUs, and the devices the table lists and
    ``targets`` do not get theirs back; no targets: everything put back and the files removed."""
    if not numa_pin.startswith("/") or any(char.isspace() or char in "\\\"'$%;" for char in numa_pin):
        raise NumaError("numa_pin %s is not an absolute path without spaces, quotes or systemd specifiers: give where "
                        "numa_host installed numa-pin (numa_host_helper_path)" % shown(numa_pin))
    before = read_table(root)
    wanted = {target.address for target in targets}
    leaving = tuple(sorted({target.address for target in before} - wanted))
    interrupts = {address: device_interrupts(root, address) for address in sorted(wanted | set(leaving))}
    originals, refused = knobs.read_originals(root, KNOB)
    if refused is not None:
        raise NumaError(refused)
    recorded = {name: value for name, _path, value in (originals.settings if originals else ())}
    fallback = default_affinity(root) if leaving else ""
    settings = [_setting(root, target.address, irq, format_cpulist(target.cpus))
                for target in targets for irq in interrupts[target.address]]
    settings += [_setting(root, address, irq, recorded.get(_name(address, irq)) or fallback)
                 for address in leaving for irq in interrupts[address]]
    why = list(reasons) + ["%s %s: no MSI interrupts (no driver bound, or a shared legacy line), nothing to move"
                           % (target.kind, target.address) for target in targets if not interrupts[target.address]]
    why += ["%s no longer follows a plan: its interrupts get back what they had" % address for address in leaving]
    after = table_text(targets, OWNER)
    if after is None and originals is not None:
        after = originals.dropin.content  # the table's own original: nothing, unless one stood there before
    found = knobs.inspect_dropin(root, TABLE_PATH)
    knob = knobs.KnobPlan(KNOB, root, tuple(settings), found.content, after, knobs.rewrite_reason(found)
                          if after is not None else found.distrust, why, [])
    return IrqPlan(knob, tuple(targets), leaving, _support_files(root, bool(targets), numa_pin), interrupts,
                   tuple(before), numa_pin)


def _name(address: str, irq: int) -> str:
    return "%s irq%d" % (address, irq)


def _setting(root: str, address: str, irq: int, cpus: str) -> knobs.Setting:
    path = "/proc/irq/%d/smp_affinity_list" % irq
    return knobs.Setting(_name(address, irq), path, knobs.read_value(root, _name(address, irq), path), cpus or None)


def _support_files(root: str, wanted: bool, numa_pin: str) -> Tuple[SupportFile, ...]:
    texts = support_texts(numa_pin)
    files = []
    for path, (text, mode) in sorted(texts.items()):
        found = knobs.inspect_dropin(root, path)
        flaw = found.distrust or (None if found.mode in (None, mode) else "mode %04o, not %04o" % (found.mode, mode))
        files.append(SupportFile(path, found.content if found.distrust is None else None,
                                 text if wanted else None, mode, flaw))
    return tuple(files)


def support_texts(numa_pin: str) -> Dict[str, Tuple[str, int]]:
    """The boot unit, its wants drop-in, irqbalance's drop-in and policy script: path -> (text, mode)."""
    header = "# Written by inferops.numa (%s); removed with the last device of %s.\n" % (OWNER, TABLE_PATH)
    return {
        "/etc/systemd/system/" + BOOT_UNIT: (header + (
            "[Unit]\nDescription=inferops.numa: device interrupts on their inference servers' nodes\n"
            "Documentation=file://%s\n"
            "After=systemd-udev-trigger.service systemd-modules-load.service local-fs.target\n"
            "Before=irqbalance.service\n\n"
            # A device has its interrupts once its driver bound, which udev's coldplug does in the background: wait
            # for its queue to drain (a failed wait still applies the table to the devices that are there).
            "[Service]\nType=oneshot\nExecStartPre=-udevadm settle --timeout=60\nExecStart=%s irqs\n")
            % (TABLE_PATH, numa_pin), DROPIN_MODE),
        "/etc/systemd/system/multi-user.target.d/60-inferops-numa-irqs.conf": (
            header + "[Unit]\nWants=%s\n" % BOOT_UNIT, DROPIN_MODE),
        # Environment= rather than a new ExecStart: the unit's own command line stays the distribution's. An
        # IRQBALANCE_ARGS in its EnvironmentFile wins over this; the run then finds irqbalance without the script
        # and says so.
        "/etc/systemd/system/irqbalance.service.d/60-inferops-numa.conf": (
            header + "[Service]\nEnvironment=IRQBALANCE_ARGS=--policyscript=%s\n" % POLICY_PATH, DROPIN_MODE),
        POLICY_PATH: ("#!/bin/sh\n" + header + (
            "# irqbalance runs this once per interrupt with the device's sysfs path and the interrupt: the devices\n"
            "# the table lists are banned (left where the collection put them), the others balanced as before.\n"
            "device=${1##*/}\n"
            "while read -r address cpus rest; do\n"
            "  if [ \"$address\" = \"$device\" ]; then echo ban=true; exit 0; fi\n"
            "done < %s\nexit 0\n") % TABLE_PATH, SCRIPT_MODE),
    }


# ---------------------------------------------------------------- acting


def apply(plan: IrqPlan, run: CommandRunner) -> List[str]:
    """Record the originals, write the table and its files, have systemd and irqbalance read them, then the
    affinities, and check the kernel holds them. The interrupts the kernel manages itself, named (not an error)."""
    targets = {target.address for target in plan.targets}
    knobs.record_originals(plan.knob._replace(settings=tuple(
        setting for setting in plan.knob.settings if setting.name.split()[0] in targets)))
    if plan.knob.dropin_changed:
        knobs.write_dropin(plan.knob)
    for item in plan.files:
        if item.changed:
            knobs.put_file(plan.knob.root, item.path, knobs.FILE if item.after is not None else knobs.ABSENT,
                           item.after, item.mode)
    _tell_systemd(plan, run)
    managed = []
    for setting in plan.knob.runtime_changes:
        if not write_affinity(plan.knob.root, setting):
            managed.append(setting)
    knobs.verify(plan.knob._replace(settings=tuple(s for s in plan.knob.settings if s not in managed)))
    if not plan.targets:
        knobs.remove_originals(plan.knob.root, KNOB)
    return ["%s: its affinity is managed by the kernel (spread over the CPUs by the driver), left as it is"
            % setting.name for setting in managed]


def write_affinity(root: str, setting: knobs.Setting) -> bool:
    """Write one interrupt's affinity; False when the kernel manages it (EIO, its answer for a managed interrupt),
    NumaError naming the cause and the fix for any other refusal."""
    try:
        write_under(root, setting.path, ("%s\n" % setting.after).encode("ascii"))
    except OSError as exc:
        if exc.errno == errno.EIO:
            return False
        raise knobs.setting_error(root, setting, exc) from None
    return True


def _tell_systemd(plan: IrqPlan, run: CommandRunner) -> None:
    """daemon-reload after a unit file changed; irqbalance restarted (if it runs) to read the table again, and
    checked to run the policy script while the table lists devices."""
    if plan.knob.root not in ("/", "") or not _systemd_runs(run):
        return
    if plan.units_changed:
        _systemctl(run, ["daemon-reload"])
    if not (plan.knob.dropin_changed or plan.units_changed) and not plan.targets:
        return
    if _systemctl(run, ["is-active", "--quiet", IRQBALANCE_UNIT], check=False):
        return
    if plan.knob.dropin_changed or plan.units_changed:
        _systemctl(run, ["try-restart", IRQBALANCE_UNIT])
    if plan.targets:
        check_irqbalance(run)


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def check_irqbalance(run: CommandRunner, read: Callable[[str], bytes] = _read_bytes) -> None:
    """Fail when the running irqbalance was not started with the policy script: it would move ours back."""
    rc, out, _err = run(["systemctl", "show", "--property=MainPID", "--value", "--", IRQBALANCE_UNIT])
    pid = out.strip()
    if rc != 0 or not pid.isdigit() or pid == "0":
        return
    try:
        argv = read("/proc/%s/cmdline" % pid).split(b"\0")
    except OSError:
        return
    if ("--policyscript=" + POLICY_PATH).encode() not in argv:
        raise NumaError("irqbalance (PID %s) runs without the collection's policy script and would move the devices' "
                        "interrupts back: IRQBALANCE_ARGS in its environment file (/etc/default/irqbalance or "
                        "/etc/sysconfig/irqbalance) replaces the drop-in's; add --policyscript=%s there"
                        % (pid, POLICY_PATH))


def _systemd_runs(run: CommandRunner) -> bool:
    try:
        rc, _out, _err = run(["systemctl", "is-system-running"])
    except (OSError, NumaError):
        return False
    return rc in (0, 1)  # 1: degraded, starting or stopping, still systemd


def _systemctl(run: CommandRunner, argv: List[str], check: bool = True) -> int:
    rc, out, err = run(["systemctl"] + argv)
    if rc != 0 and check:
        raise NumaError("systemctl %s failed (rc %d): %s; the table and its files are written, run again once "
                        "systemd answers" % (" ".join(argv), rc, " ".join((err or out).split())[:200]))
    return rc


# ---------------------------------------------------------------- the A/B gate


def apply_gated(plan: IrqPlan, gated: Sequence[Tuple[str, ab_gate.Gate]], run: CommandRunner,
                rates: ab_gate.Rates = ab_gate.measure) -> Tuple[List[str], Dict[str, Dict[str, Any]], bool]:
    """``apply``, judged as a placement change is (measure/ab_gate.before_and_after): the table before written again
    when a gated instance is slower, the rolled-back table recorded first (so a run after a failed rollback finishes
    it, and none measures the same loss again). (managed interrupts, verdicts by unit, whether it was rolled back)."""
    managed, verdicts, slower = ab_gate.before_and_after(
        gated, lambda: apply(plan, run), lambda: rollback(plan, run), "the interrupts were put back as they were",
        rates)
    if slower:
        knobs.write_rejected(plan.knob.root, REJECTED_PATH, {
            "table": table_text(plan.targets, OWNER) or "", "previous": table_text(plan.previous, OWNER),
            "verdict": "; ".join(slower)})
        rollback(plan, run)
    return managed, verdicts, bool(slower)


def rollback(plan: IrqPlan, run: CommandRunner) -> None:
    """The table before ``plan`` written again, its devices' interrupts with it, the others' put back."""
    apply(make_plan(plan.knob.root, plan.previous, plan.numa_pin), run)


# ---------------------------------------------------------------- at boot


def apply_table(root: str, table: Sequence[IrqTarget]) -> Tuple[List[str], List[str]]:
    """``numa-pin irqs``: the table's CPUs (read_table) written to its devices' interrupts as numbered at this boot;
    (what was set, what was left to the kernel). NumaError for a write the kernel refused."""
    done, managed = [], []
    for target in table:
        for irq in device_interrupts(root, target.address):
            setting = _setting(root, target.address, irq, format_cpulist(target.cpus))
            if setting.before == setting.after or write_affinity(root, setting):
                done.append("%s -> %s" % (setting.name, setting.after))
            else:
                managed.append(setting.name)
    return done, managed


# ---------------------------------------------------------------- watching


def served_elsewhere(root: str) -> List[Dict[str, Any]]:
    """Each device of the table with its CPUs, its interrupts, and how many of them the kernel lets run on a CPU
    outside those (something moved them, or the kernel manages them); [] without a table. NumaError for a table
    that cannot be trusted."""
    found = []
    for target in read_table(root):
        irqs, outside = _serving(root, target)
        found.append({"device": target.address, "cpus": format_cpulist(target.cpus), "interrupts": len(irqs),
                      "outside": len(outside)})
    return found


def _serving(root: str, target: IrqTarget) -> Tuple[Tuple[int, ...], Dict[int, str]]:
    """The device's interrupts now, and those the kernel lets run outside its CPUs with their affinity, a CPU list
    ("" when it cannot be read as one)."""
    irqs = device_interrupts(root, target.address)
    outside = {}
    for irq in irqs:
        try:
            serving = knobs.read_value(root, _name(target.address, irq), "/proc/irq/%d/smp_affinity_list" % irq) or ""
            cpus = set(parse_cpulist(serving))
        except NumaError:
            serving, cpus = "", set()
        if not cpus or not cpus <= set(target.cpus):
            outside[irq] = serving
    return irqs, outside


def audit_interrupts(report: Dict[str, Any], root: str, plan: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """An instance's audit report with its devices' interrupts held to the table numa_irqs keeps (decide/device_irqs:
    its GPUs, the NICs and NVMe drives on its nodes): ``device_irqs``, each listed device with how many of its
    interrupts are served outside its CPUs, and a failure naming each such interrupt. Unchanged without a plan, a
    table that lists a device, or processes audited; a table that cannot be trusted is a warning, not the
    instance's failure."""
    if not plan or "processes" not in report:
        return report
    try:
        table = read_table(root)
    except NumaError as exc:
        report.setdefault("warnings", []).append("device interrupts not audited: %s" % exc)
        return report
    if not table:
        return report
    entries, problems = [], []
    for target in instance_targets(table, plan):
        irqs, outside = _serving(root, target)
        cpus = format_cpulist(target.cpus)
        entries.append({"device": target.address, "kind": target.kind, "cpus": cpus, "interrupts": len(irqs),
                        "outside": len(outside)})
        if outside:
            problems.append("%s %s: interrupt(s) %s served on CPUs %s, not its %s in %s; %s, then run numa_irqs "
                            "again" % (target.kind, target.address, ", ".join(map(str, outside)),
                                       " / ".join(sorted(set(where or "?" for where in outside.values()))),
                                       cpus, TABLE_PATH, KNOB.rewritten_by))
    report["device_irqs"] = entries
    if problems:
        report["msg"] += (". FAILED: " if report["ok"] else "; ") + "; ".join(problems)
        report["ok"] = False
    return report


# ---------------------------------------------------------------- reporting


def result(plan: IrqPlan, check_mode: bool, managed: Sequence[str] = (),
           verdicts: Optional[Dict[str, Dict[str, Any]]] = None, rolled_back: bool = False) -> Dict[str, Any]:
    would = "would " if check_mode else ""
    changes = ["%s %s -> %s" % (s.name, s.before, s.after) for s in plan.knob.runtime_changes]
    if plan.knob.dropin_changed:
        changes.append(("write " if plan.knob.dropin_after is not None else "remove ") + TABLE_PATH)
    changes += [("write " if item.after is not None else "remove ") + item.path for item in plan.files if item.changed]
    what = "%sset %s" % (would, "; ".join(changes)) if changes else "device interrupts already as planned"
    if rolled_back:
        what = "rolled back, slower by the A/B gate: %s (recorded in %s: the same table is not tried again)" % (
            "; ".join("%s %s" % (unit, verdict["msg"]) for unit, verdict in sorted((verdicts or {}).items())
                      if not verdict["kept"]), REJECTED_PATH)
    return {"changed": plan.changed, "table": TABLE_PATH, "leaving": list(plan.leaving),
            "ab_gate": verdicts or {}, "rolled_back": rolled_back,
            "devices": {target.address: {"kind": target.kind, "node": target.node,
                                         "cpus": format_cpulist(target.cpus), "spare": target.spare,
                                         "interrupts": list(plan.interrupts.get(target.address, ()))}
                        for target in plan.targets},
            "reasons": plan.knob.reasons + list(managed), "msg": what}


def diff(plan: IrqPlan) -> List[Dict[str, str]]:
    return knobs.diff(plan.knob) + [
        {"before_header": item.path, "after_header": item.path, "before": item.before or "", "after": item.after or ""}
        for item in plan.files if item.changed]
