"""numa_balancing and numa_weights run by ansible-playbook on one fake host root: set, then state/source original
puts back the runtime values and the drop-ins byte for byte and deletes the originals records; a second restore
changes nothing."""

import json
import os
import subprocess

import yaml

from tests.fixtures import sysfs
from tests.tools import ansible_command
from tests.unit.balancing_fakeroot import FakeRoot
from tests.unit.test_balancing_module import REPO

ADMIN_SYSCTL = "/etc/sysctl.d/60-inferops-numa.conf"
WEIGHTS_DROPIN = "/etc/tmpfiles.d/60-inferops-numa-weights.conf"
ORIGINALS = "/var/lib/inferops-numa/originals"


def snapshot(root):
    """Every file's bytes and mode under the knobs and drop-in directories (the records are checked apart)."""
    found = {}
    for top in ("proc/sys", "sys/kernel/mm/mempolicy", "etc"):
        for directory, _dirs, names in os.walk(os.path.join(root, top)):
            for name in names:
                path = os.path.join(directory, name)
                with open(path, "rb") as handle:
                    found[os.path.relpath(path, root)] = (handle.read(), os.stat(path).st_mode & 0o7777)
    return found


def play(root, tmp_path, tasks, check=False):
    """The tasks run against localhost with root; the results of the registered ones, by name."""
    playbook = tmp_path / "play.yml"
    results = tmp_path / "results.json"
    registered = [task["register"] for task in tasks if "register" in task]
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "module_defaults": {"group/inferops.numa.numa": {"root": root}},
        "tasks": tasks + [{"ansible.builtin.copy": {
            "content": "{{ {%s} | to_json }}" % ", ".join("'%s': %s" % (name, name) for name in registered),
            "dest": str(results)}, "check_mode": False}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
    proc = subprocess.run([ansible_command("ansible-playbook"), str(playbook)] + (["--check"] if check else []),
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(results.read_text())


def restore_tasks():
    return [{"inferops.numa.numa_balancing": {"state": "original"}, "register": "balancing", "diff": True},
            {"inferops.numa.numa_weights": {"source": "original"}, "register": "weights", "diff": True}]


def test_set_then_original_puts_the_host_back_byte_for_byte(tmp_path):
    root = str(tmp_path / "root")
    sysfs.snc2_cxl().write(root)
    host = FakeRoot(root).knobs(balancing=1, zone_reclaim=0).file(ADMIN_SYSCTL, "kernel.numa_balancing = 1\n")
    os.chmod(host.real(ADMIN_SYSCTL), 0o640)  # the admin's own file at our drop-in's name, its mode too
    before = snapshot(root)

    done = play(root, tmp_path, [
        {"inferops.numa.numa_balancing": {"state": "disabled", "zone_reclaim_mode": 1}, "register": "balancing"},
        {"inferops.numa.numa_weights": {"source": "hmat"}, "register": "weights"}])
    assert done["balancing"]["changed"] and done["weights"]["changed"]
    assert snapshot(root) != before and sorted(os.listdir(host.real(ORIGINALS))) == [
        "numa_balancing.json", "numa_weights.json"]

    checked = play(root, tmp_path, restore_tasks(), check=True)
    assert checked["balancing"]["changed"] and checked["weights"]["changed"]
    assert checked["balancing"]["msg"].startswith("would restore the originals of numa_balancing")
    assert snapshot(root) != before and len(os.listdir(host.real(ORIGINALS))) == 2

    restored = play(root, tmp_path, restore_tasks())
    assert restored["balancing"]["changed"] and restored["weights"]["changed"]
    assert restored["weights"]["weights"] == {str(node): 1 for node in range(5)}
    assert snapshot(root) == before and not os.path.exists(host.real(WEIGHTS_DROPIN))
    assert os.listdir(host.real(ORIGINALS)) == []

    again = play(root, tmp_path, restore_tasks())
    assert not again["balancing"]["changed"] and not again["weights"]["changed"]
    assert "nothing to restore" in again["balancing"]["msg"] and snapshot(root) == before
