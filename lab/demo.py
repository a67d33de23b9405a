#!/usr/bin/env python3
"""`make demo`: the example fleet deployed into the emulated dual-socket lab guest.

    demo.py up     boot the guest (cached image), install a real llama-server and a
                   generated model in it, run site.yml with inventory/example, print
                   where every instance runs and how local its memory is
    demo.py down   stop the guest

The guest stands in for `llm-01` of inventory/example: same group (llm_cpu), same
group_vars, so what runs is exactly the README's fleet example.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import labvm  # noqa: E402  (lab/ is not a package)
sys.path.insert(0, str(REPO / "build"))  # the checkout as ansible_collections/inferops/numa (make venv links it)
# The table the inference_service role ends a deployment with: one function formats both.
from ansible_collections.inferops.numa.plugins.module_utils.numa.watch.table import placement_table  # noqa: E402

VM_NAME = "demo"
MODEL_MB = 32
# Seconds 16 tokens take on the reference machine; the wait scales with the guest's calibration.
COMPLETION_S = 10
DEMO_DIR = REPO / "build" / "demo"
BIN = Path(sys.executable).parent


def sh(argv, **kwargs):
    return subprocess.run([str(a) for a in argv], check=True, **kwargs)


def build_llama_server() -> Path:
    out = sh(["bash", HERE / "llama" / "build_server.sh"], stdout=subprocess.PIPE, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def make_model() -> Path:
    out = sh([sys.executable, HERE / "llama" / "make_model.py", "--size-mb", MODEL_MB],
             stdout=subprocess.PIPE, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def write_inventory(vm: dict) -> Path:
    DEMO_DIR.mkdir(parents=True, exist_ok=True)
    inventory = DEMO_DIR / "hosts.yml"
    inventory.write_text(
        "# Written by lab/demo.py: the lab guest as a member of inventory/example's llm_cpu group.\n"
        "llm_cpu:\n  hosts:\n    numa-lab-demo:\n"
        "      ansible_host: %s\n      ansible_port: %s\n      ansible_user: %s\n"
        "      ansible_ssh_private_key_file: %s\n"
        "      ansible_ssh_common_args: -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null\n"
        "      # 1 GiB per node: the default headroom (10%%+1G, sized for real servers) fits nowhere here.\n"
        "      inference_service_defaults:\n        memory_headroom: 64M\n"
        % (vm["address"], vm["port"], vm["user"], vm["identity_file"]))
    return inventory


def ansible_playbook(inventory: Path, playbook: Path, extra=()):
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    sh([BIN / "ansible-playbook", "-i", REPO / "inventory" / "example", "-i", inventory,
        "--limit", "numa-lab-demo", playbook] + list(extra), cwd=REPO, env=env)


def instance_rows(vm: dict):
    units = labvm.run_ssh(vm, "systemctl list-units --plain --no-legend --type=service 'llama@*' "
                              "| awk '{print $1}'").stdout.split()
    for unit in sorted(units):
        name = unit[:-len(".service")]
        plan = json.loads(labvm.run_ssh(vm, "cat /etc/inferops-numa/%s.plan.json" % name).stdout)
        # Tokens first: making them reads every weight, so the audit then sees the whole model.
        tokens = _tokens_per_second(vm, plan.get("port"))
        audit = labvm.run_ssh(vm, "/usr/local/bin/numa-pin audit --unit %s --plan-file "
                                  "/etc/inferops-numa/%s.plan.json" % (unit, name), check=False)
        report = json.loads(audit.stdout) if audit.stdout.strip() else {}
        yield {"instance": name, "plan": plan, "audit": report, "tokens_per_second": tokens}


def _tokens_per_second(vm: dict, port):
    """Ask the instance for 16 tokens; its own timings say how fast they came (None: no answer, shown "-")."""
    body = json.dumps({"prompt": "The socket link costs", "n_predict": 16, "ignore_eos": True})
    seconds = labvm.budget(vm, COMPLETION_S)
    answer = labvm.run_ssh(vm, "curl -sf --max-time %d http://127.0.0.1:%s/completion -d '%s'" % (seconds, port, body),
                           check=False, timeout=seconds + 60)
    if answer.returncode != 0:
        return None
    return json.loads(answer.stdout)["timings"]["predicted_per_second"]


def describe_topology(vm: dict) -> str:
    """What the guest's kernel reports, e.g. '2 nodes: node 0 CPUs 0-1, node 1 CPUs 2-3; SLIT 10/21'."""
    facts = json.loads(labvm.run_ssh(vm, "/usr/local/bin/numa-pin facts").stdout)
    nodes = ", ".join("node %d CPUs %s" % (node["id"], node["cpulist"] or "none") for node in facts["nodes"])
    distances = sorted({d for row in facts.get("distances") or [] for d in row})
    slit = "; SLIT %s" % "/".join(str(d) for d in distances) if distances else ""
    return "%d node(s): %s%s" % (facts["node_count"], nodes, slit)


def up() -> int:
    labvm.ensure_image()
    server, model = build_llama_server(), make_model()
    vm = labvm.up(VM_NAME, numa=2)
    labvm.run_ssh(vm, "mkdir -p /opt/llama.cpp /srv/models")
    labvm.put_file(vm, server / "llama-server.tar.gz", "/tmp/llama-server.tar.gz")
    labvm.run_ssh(vm, "tar -C /opt/llama.cpp -xzf /tmp/llama-server.tar.gz && rm /tmp/llama-server.tar.gz")
    labvm.put_file(vm, model, "/srv/models/model.gguf")
    ansible_playbook(write_inventory(vm), REPO / "site.yml")
    print("\nThe example fleet in the emulated dual-socket guest (%s):\n" % describe_topology(vm))
    print("\n".join(placement_table(instance_rows(vm))))
    print("\nssh in:   python3 lab/labvm.py ssh %s" % VM_NAME)
    print("try:      curl -s http://127.0.0.1:8080/completion -d '{\"prompt\":\"Hi\",\"n_predict\":8}'   (inside)")
    print("stop it:  make demo-down")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("up", "down"))
    if parser.parse_args(argv).action == "down":
        labvm.down(VM_NAME)
        return 0
    return up()


if __name__ == "__main__":
    sys.exit(main())
