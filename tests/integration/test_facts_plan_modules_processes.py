"""numa_facts and numa_plan run ad hoc by the ansible command on a captured box."""

import json
import os
import subprocess

from tests.fixtures import sysfs
from tests.tools import ansible_command
from tests.unit.test_facts_plan_modules import REPO


def adhoc(module, args):
    """``ansible localhost -m inferops.numa.<module> -a ARGS`` from the checkout: (result dict, the run's output)."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    done = subprocess.run([ansible_command("ansible"), "localhost", "-m", "inferops.numa." + module, "-a", args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "localhost | SUCCESS => " in done.stdout, output
    return json.loads(done.stdout.split(" => ", 1)[1]), output


def test_numa_facts_and_numa_plan_ad_hoc_on_a_captured_box(tmp_path):
    root = sysfs.dual_socket_gpus().write(str(tmp_path))
    facts, output = adhoc("numa_facts", "root=%s" % root)
    # No "[WARNING]: Collection inferops.numa does not support Ansible version ...": meta/runtime.yml admits this core.
    assert "WARNING" not in output, output
    assert facts["changed"] is False and facts["ansible_facts"]["numa"]["node_count"] == 2
    planned, output = adhoc("numa_plan", "root=%s instances=2 instance=1 model_size=14G gpus=none port_base=8080"
                            % root)
    assert "WARNING" not in output, output
    assert (planned["plan"]["node"], planned["plan"]["port"], planned["plan"]["threads"]) == (1, 8081, 80)
