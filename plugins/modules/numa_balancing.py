#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: numa_balancing
short_description: Turn Linux automatic NUMA balancing off (or on) now and at every boot
version_added: "0.1.0"
description:
  - Automatic NUMA balancing (C(kernel.numa_balancing)) unmaps pages to sample accesses and migrates them. On a
    service whose CPU and memory placement is set on purpose it only adds hinting-fault stalls and moves pages away
    from where they were bound; the kernel documentation says to disable it when the workload is already NUMA-bound.
  - Writes the runtime value to C(/proc/sys/kernel/numa_balancing) and, with I(persist), one drop-in file that the
    collection owns, C(/etc/sysctl.d/60-inferops-numa.conf). It never edits any other file.
  - Never leaves I(root). Every path under it is opened one component at a time without following symlinks, so a
    symlinked knob or C(etc/sysctl.d) is refused, not followed; symlinks in sysctl and tuned files are followed
    inside I(root) only. The drop-in is written to a randomly named temporary file created in the same directory,
    synced and renamed over the old one, so it is always a regular file owned by the user the module runs as (root)
    with mode 0644, even when a symlink or another user's file stood there. Errors name the path and what was
    expected, never a file's content.
  - Reads every sysctl file systemd-sysctl applies at boot (C(/etc/sysctl.d), C(/run/sysctl.d),
    C(/usr/local/lib/sysctl.d), C(/usr/lib/sysctl.d), C(/lib/sysctl.d), sorted by file name; C(/etc/sysctl.conf)
    last) and fails, naming the file and line, when one applied after the drop-in sets a different value, because
    the setting would otherwise silently come back after a reboot. Settings in files applied before the drop-in are
    harmless and reported in C(msg) and C(conflicts).
  - Warns when the active tuned profile (or a profile it includes) sets the knob, because tuned writes it when it
    starts, after systemd-sysctl.
  - On a kernel without the knob (built without C(CONFIG_NUMA_BALANCING), non-NUMA VM kernels) it reports
    C(supported=false), writes nothing and succeeds.
author:
  - inferops.numa contributors (@inferops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - inferops.numa.host_root
options:
  state:
    description:
      - C(disabled) writes 0, C(enabled) writes 1 (normal NUMA balancing), C(tiering) writes 2 (memory tiering mode
        only, Linux >= 5.18), C(raw) writes I(value).
      - C(auto) decides on the host from the kernel's memory tiers (C(/sys/devices/virtual/memory_tiering), Linux
        >= 6.1). It writes C(tiering) where nodes sit in more than one tier (CXL, PMEM or HBM memory beside DRAM), so
        hot pages are still promoted from the slower tier while nothing is balanced across sockets, and C(disabled)
        everywhere else. C(msg) says which and why, and C(state) returns it.
      - C(disabled) on a host with memory tiers is applied with a warning that promotion from the slower tier stops.
      - C(original) puts back what was there before this module's first change on the host. That first change
        records, once, the runtime values it sets and what stood at the drop-in's path (a file and its text and
        mode, nothing, or a mask) in C(/var/lib/inferops-numa/originals/numa_balancing.json), a file only root may
        read in a directory only root may write; later runs add a key they newly set, never overwrite one. C(original)
        writes the recorded values back, puts the drop-in back byte for byte (its mode less group and other write) or
        removes it, checks the kernel holds the values, and deletes the record. With no record it changes nothing
        and says so. A record that is a symlink, not root's, writable by others, or not the JSON this module writes
        (or naming a file that is not this knob's) is refused, naming the cause and the fix, and nothing is changed.
        I(value) and I(zone_reclaim_mode) are refused with it; I(persist), I(on_conflict) and I(force) are not used.
    type: str
    choices: [disabled, enabled, tiering, raw, auto, original]
    default: disabled
  value:
    description:
      - The integer to write when I(state=raw); required then, refused otherwise.
    type: int
  persist:
    description:
      - Write C(/etc/sysctl.d/60-inferops-numa.conf) so the value is applied at every boot.
      - With C(false) only the running kernel is changed and that drop-in is removed if present, so the host's other
        sysctl files decide the boot value; settings there that differ are reported as warnings, never failures.
    type: bool
    default: true
  zone_reclaim_mode:
    description:
      - Also set C(vm.zone_reclaim_mode) (bit mask, 0 = allocate from other nodes rather than reclaim locally), at
        runtime and in the drop-in. Left alone when omitted.
    type: int
  on_conflict:
    description:
      - What to do when a sysctl file applied after the drop-in at boot sets a different value.
      - C(fail) stops before changing anything; C(warn) applies the setting and warns.
    type: str
    choices: [fail, warn]
    default: fail
  force:
    description:
      - Replace the drop-in (or, with I(persist=false), remove it) even when it is masked, that is a symlink to
        C(/dev/null), which sysctl.d(5) documents as the way to disable a file name.
      - With C(false) a masked drop-in is left alone and reported in a warning and in C(dropin_masked); the runtime
        value is still set, but it is not persisted.
    type: bool
    default: false
    version_added: "0.1.0"
  verify_seconds:
    description:
      - Sample C(numa_pte_updates) and C(numa_hint_faults) in C(/proc/vmstat) twice, this many seconds apart, after
        acting and return the growth in C(vmstat_delta). With balancing off both must stay flat; the module warns if
        they move.
    type: float
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: The diff shows the drop-in file and the runtime values (with I(state=original), what is put back).
  platform:
    support: full
    platforms: [linux]
notes:
  - Needs root to write C(/proc/sys) and C(/etc/sysctl.d) (C(become=true)). In a container C(/proc/sys) is
    read-only and the knob is not namespaced, so run it on the host.
  - Glob keys in sysctl files (C(kernel.numa_*)) are not conflicts, because systemd-sysctl never applies a glob to a
    key that a file sets explicitly.
  - With tuned's default C(reapply_sysctl=1), tuned re-applies C(/etc/sysctl.d) after its profile, so the drop-in
    wins again, but the knob flips in between; the warning says how to fix the profile.
  - Values set before the originals record existed (by an older release of the collection) cannot be told from the
    host's own, so the first recorded run records what it finds.
  - Full behaviour and the boot-order rules are in the collection's C(docs/numa_balancing.md).
seealso:
  - name: Kernel documentation of numa_balancing
    description: The sysctl reference for kernel.numa_balancing.
    link: https://docs.kernel.org/admin-guide/sysctl/kernel.html#numa-balancing
  - name: sysctl.d(5)
    description: Which sysctl files systemd applies at boot, and in which order.
    link: https://www.freedesktop.org/software/systemd/man/latest/sysctl.d.html
"""

EXAMPLES = r"""
- name: Disable automatic NUMA balancing now and at every boot
  inferops.numa.numa_balancing:
    state: disabled
  become: true

- name: Disable it, keep zone reclaim off too, and prove the scanner stopped
  inferops.numa.numa_balancing:
    state: disabled
    zone_reclaim_mode: 0
    verify_seconds: 5
  become: true
  register: balancing

- name: Show the counters, which must not grow
  ansible.builtin.debug:
    var: balancing.vmstat_delta

- name: Apply it although a vendor file sets it later at boot (warn instead of fail)
  inferops.numa.numa_balancing:
    state: disabled
    on_conflict: warn
  become: true

- name: Memory tiering mode only (CXL / PMEM tiers)
  inferops.numa.numa_balancing:
    state: tiering
  become: true

- name: Tiering where the host has memory tiers, disabled where it has none
  inferops.numa.numa_balancing:
    state: auto
  become: true

- name: Persist it even where an admin masked the drop-in with a symlink to /dev/null
  inferops.numa.numa_balancing:
    state: disabled
    force: true
  become: true

- name: Runtime only, give the boot value back to the host's own sysctl files
  inferops.numa.numa_balancing:
    state: enabled
    persist: false
  become: true

- name: Put back the value and the drop-in the host had before the first change
  inferops.numa.numa_balancing:
    state: original
  become: true

# Ad hoc:  ansible all -b -m inferops.numa.numa_balancing -a state=disabled
"""

RETURN = r"""
supported:
  description: Whether this kernel has C(kernel.numa_balancing). When false nothing was read further or written.
  returned: always
  type: bool
  sample: true
state:
  description: The state written (or that would be); with I(state=auto), the one chosen on this host; C(original)
    when the originals were put back.
  returned: always
  type: str
  sample: tiering
before:
  description: Runtime values read before acting, by sysctl name (C(vm.zone_reclaim_mode) is included when present).
  returned: always
  type: dict
  sample: {"kernel.numa_balancing": 1, "vm.zone_reclaim_mode": 0}
after:
  description: Runtime values after acting (in check mode, what they would be).
  returned: always
  type: dict
  sample: {"kernel.numa_balancing": 0, "vm.zone_reclaim_mode": 0}
persisted_file:
  description: The drop-in path (under I(root)), or null when I(persist=false), unsupported, or the drop-in is masked
    and left alone.
  returned: always
  type: str
  sample: /etc/sysctl.d/60-inferops-numa.conf
dropin_masked:
  description: Whether the drop-in is masked (a symlink to C(/dev/null)) and was left alone because I(force=false).
  returned: always
  type: bool
  sample: false
conflicts:
  description:
    - Lines in other sysctl files that set a managed key to a different value.
    - C(applied_after_ours) tells whether the file is applied after the drop-in at boot, C(wins_at_boot) whether its
      value is the one the kernel ends up with (those make the module fail unless I(on_conflict=warn)), C(fix) how
      to remove the conflict.
  returned: always
  type: list
  elements: dict
  sample:
    - file: /etc/sysctl.d/99-zz.conf
      key: kernel.numa_balancing
      value: "1"
      line: 3
      applied_after_ours: true
      wins_at_boot: true
      fix: remove or change line 3 of /etc/sysctl.d/99-zz.conf
tuned:
  description:
    - The active tuned profile (C(active_profile)), the profile files read in load order (C(files)), the managed keys
      it sets (C(settings), each with profile, file, key and value) and tuned's C(reapply_sysctl); null when no
      profile is active.
  returned: always
  type: dict
  sample:
    active_profile: throughput-performance
    files: [/usr/lib/tuned/throughput-performance/tuned.conf]
    settings: [{"profile": "throughput-performance", "file": "/usr/lib/tuned/throughput-performance/tuned.conf",
                "key": "kernel.numa_balancing", "value": "1"}]
    reapply_sysctl: true
vmstat_delta:
  description: Growth of the balancing counters over C(seconds); a counter the kernel lacks is null.
  returned: when verify_seconds is set and the knob is supported
  type: dict
  sample: {"seconds": 5.0, "numa_pte_updates": 0, "numa_hint_faults": 0}
msg:
  description: What was (or would be) changed, and why nothing was when so.
  returned: always
  type: str
  sample: "set kernel.numa_balancing 1 -> 0; wrote /etc/sysctl.d/60-inferops-numa.conf"
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import balancing, knobs
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa_specs import host_root_argument_spec

ARGUMENT_SPEC = {
    "state": {"type": "str", "default": "disabled", "choices": list(balancing.STATES) + [balancing.ORIGINAL]},
    "value": {"type": "int"},
    "persist": {"type": "bool", "default": True},
    "zone_reclaim_mode": {"type": "int"},
    "on_conflict": {"type": "str", "default": "fail", "choices": ["fail", "warn"]},
    "force": {"type": "bool", "default": False},
    "verify_seconds": {"type": "float"},
    **host_root_argument_spec(),
}


def run(module: AnsibleModule) -> dict:
    params = module.params
    request = balancing.BalancingRequest(params["state"], params["value"], params["persist"],
                                         params["zone_reclaim_mode"], params["on_conflict"], params["force"])
    if request.state == balancing.ORIGINAL:
        return run_restore(module, request)
    plan = balancing.make_plan(params["root"], request)
    result = balancing.result(plan, module.check_mode)
    if plan.error:
        module.fail_json(**dict(result, changed=False, msg=plan.error))
    if plan.changed and not module.check_mode:
        knobs.apply(plan.knob)
    warnings = list(plan.warnings)
    if params["verify_seconds"] is not None and plan.supported:
        result["vmstat_delta"], warning = balancing.verify(plan, params["verify_seconds"], module.check_mode)
        warnings.extend([warning] if warning else [])
    for warning in warnings:
        module.warn(warning)
    if module._diff and plan.supported:
        result["diff"] = balancing.diff(plan)
    return result


def run_restore(module: AnsibleModule, request: balancing.BalancingRequest) -> dict:
    """state=original: the recorded originals put back, or a record not to be trusted refused."""
    conflict = balancing.restore_conflict(request)
    if conflict:
        module.fail_json(msg=conflict)
    refused, result = knobs.put_back(module.params["root"], balancing.KNOB, module.check_mode, module._diff,
                                     balancing.restore_result)
    if refused:
        module.fail_json(msg=refused, changed=False)
    return result


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = run(module)
    except NumaError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
