"""numa_irqs's irqbalance policy script, run by sh as irqbalance runs it: one device path and interrupt at a time."""

import os
import subprocess

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import device_irqs
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.device_irqs import IrqTarget
from tests.unit.test_device_irqs import NIC0, NIC1, host, no_systemd


def test_the_policy_script_bans_the_tables_devices_and_no_other(tmp_path):
    root = host(tmp_path)
    device_irqs.apply(device_irqs.make_plan(root, [IrqTarget(NIC1, "nic", 1, (6,), True)], "/usr/bin/numa-pin"),
                      no_systemd)
    script = os.path.join(root, device_irqs.POLICY_PATH.lstrip("/"))
    assert os.stat(script).st_mode & 0o777 == 0o755
    # The script reads the host's table; here the test root's, by its text with the path replaced.
    text = open(script).read().replace(device_irqs.TABLE_PATH, os.path.join(root, device_irqs.TABLE_PATH.lstrip("/")))
    for device, banned in ((NIC1, "ban=true\n"), (NIC0, ""), ("0000:81:00.1", "")):
        done = subprocess.run(["sh", "-c", text, "policy", "/sys/devices/pci0000:80/0000:80:01.0/" + device, "45"],
                              stdout=subprocess.PIPE, universal_newlines=True, check=True)
        assert done.stdout == banned, device
