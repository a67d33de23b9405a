"""The collection from inside its execution environment, run as AWX runs a job: ansible-runner starts the EE
(lab/ee.py builds it on a local Debian base) with podman, hands it the machine credential as env/ssh_key and
runs a project's playbooks that import the collection's own. Against the converged guest, site.yml from the EE
changes nothing (the checkout deployed exactly what the EE would) and the fleet report the EE writes is the one
the checkout writes.

First in file order: it needs the guest as converge left it, before other checks change services.
"""

import json
import os
import re
import subprocess
import sys

from conftest import CONVERGE_S, PROJECT, VM_NAME, budget, labvm

sys.path.insert(0, os.path.join(PROJECT, "lab"))
import ee  # noqa: E402  (lab/ is not a package)

FLEET_REPORT_S = 60       # playbooks/fleet_report.yml against the guest
RUN_VARS = os.path.join(PROJECT, "build", "reports", "lab-run-vars.json")
# What differs between two runs of the same report: the figures (free memory, pages, times) and the date.
FIGURES = re.compile(r"\d+(?:[.:]\d+)*")


def _private_data_dir(root, guest) -> str:
    """An ansible-runner private data dir: the project (playbooks that import the collection's, as an AWX project
    does), the guest's inventory, its SSH key as the job's credential, and the converge's variables."""
    for folder in ("project", "inventory", "env", "report"):
        os.makedirs(os.path.join(root, folder))
    for name in ("site", "fleet_report"):
        with open(os.path.join(root, "project", name + ".yml"), "w") as handle:
            handle.write("---\n- name: The collection's %s\n  ansible.builtin.import_playbook: inferops.numa.%s\n"
                         % (name, name))
    with open(os.path.join(root, "inventory", "hosts.json"), "w") as handle:
        json.dump({"all": {"hosts": {"numa-lab": {
            "ansible_host": guest["address"], "ansible_port": guest["port"], "ansible_user": guest["user"],
            "ansible_python_interpreter": "/usr/bin/python3"}}}}, handle)
    with open(str(guest["identity_file"])) as key, open(os.path.join(root, "env", "ssh_key"), "w") as handle:
        handle.write(key.read())
    with open(os.path.join(root, "env", "envvars"), "w") as handle:
        json.dump({"ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_NOCOLOR": "1"}, handle)
    with open(RUN_VARS) as handle:
        run_vars = json.load(handle)
    with open(os.path.join(root, "env", "extravars"), "w") as handle:
        json.dump(dict(run_vars, fleet_report_dir="/runner/report"), handle)
    return root


def _runner(root, playbook, seconds):
    runner = os.path.join(os.path.dirname(sys.executable), "ansible-runner")
    done = subprocess.run([runner, "run", root, "-p", playbook, "--ident", playbook.split(".")[0],
                           "--process-isolation", "--process-isolation-executable", "podman",
                           "--container-image", ee.EE_NAME, "--container-option=--network=host",
                           # The runner hands the key through a FIFO only its own user may read: under rootful
                           # podman that is the container's root, not the image's uid 1000 (rootless podman, as
                           # AWX runs it, maps the invoking user to the container's root the same way).
                           "--container-option=--user=0"],
                          env=ee.podman_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=budget(seconds) * 2)
    assert done.returncode == 0, done.stdout[-6000:]
    return done.stdout


def _recap(output):
    """{counter: value} of the guest's PLAY RECAP line."""
    (line,) = [line for line in output.splitlines() if line.startswith("numa-lab ") and "ok=" in line]
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", line)}


def _checkout_fleet_report(report_dir):
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    subprocess.run([playbook, "-i", os.environ["MOLECULE_INVENTORY_FILE"], "-b",
                    os.path.join(PROJECT, "playbooks", "fleet_report.yml"), "-e", "@" + RUN_VARS,
                    "-e", "fleet_report_dir=%s" % report_dir],
                   check=True, timeout=budget(FLEET_REPORT_S) * 2, cwd=PROJECT, stdout=subprocess.DEVNULL)
    with open(os.path.join(report_dir, "fleet_report.md")) as handle:
        return handle.read()


def _compiled_in_the_image(*paths):
    """Whether the EE holds the bytecode of each of the collection's ``paths``, so a job's forks need not
    compile them (the image's uid 1000 could not write it)."""
    collection = "/usr/share/ansible/collections/ansible_collections/inferops/numa/"
    check = ("import importlib.util, os, sys; "
             "print(all(os.path.exists(importlib.util.cache_from_source(path)) for path in sys.argv[1:]))")
    done = subprocess.run(["podman", "run", "--rm", ee.EE_NAME, "python3", "-c", check]
                          + [collection + path for path in paths], env=ee.podman_environment(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
    assert done.returncode == 0, done.stdout
    return done.stdout.strip().splitlines()[-1] == "True"


def test_site_and_the_fleet_report_from_inside_the_ee_match_the_checkouts_run(two_nodes, tmp_path):
    built = ee.build(log=sys.stdout)
    print("EE %s built in %s s" % (built["name"], built["seconds"]))
    assert _compiled_in_the_image("plugins/filter/systemd_unit.py", "plugins/plugin_utils/preflight.py")
    root = _private_data_dir(str(tmp_path / "job"), labvm.instance(VM_NAME))

    recap = _recap(_runner(root, "site.yml", CONVERGE_S))
    assert recap["failed"] == 0 and recap["unreachable"] == 0 and recap["ok"] > 0, recap
    assert recap["changed"] == 0, "site.yml from the EE changed what the checkout's converge deployed: %s" % recap

    _runner(root, "fleet_report.yml", FLEET_REPORT_S)
    with open(os.path.join(root, "report", "fleet_report.md")) as handle:
        from_ee = handle.read()
    from_checkout = _checkout_fleet_report(str(tmp_path / "checkout"))
    assert "numa-lab" in from_ee and "llama" in from_ee and "unreachable:" not in from_ee
    assert FIGURES.sub("#", from_ee) == FIGURES.sub("#", from_checkout)
