"""A removal leaves the container as create.yml found it: site.yml with the stand-in service's entry at
``state: absent`` and ``numa_host_state: absent``, compared with the snapshot of the fresh container; and a first
deployment that fails leaves the container as it found it."""

import json

import yaml

from conftest import (CONVERGE_OWN, SERVICES_FILE, TIMER_OWN, converge, differences, fresh_snapshot, ports, site,
                      snapshot)

# systemd's own, left by a removal done by hand (services stopped and disabled, files, user and group removed, daemon
# reloaded) in this container: the slice systemd made for the template's instances, empty once they stopped, and the
# target the service's unit pulled in (Wants=network-online.target), which stays reached. Neither holds anything.
SYSTEMD_OWN = ["system-standin.slice", "network-online.target"]


def _entries() -> list:
    """The scenario's services as converge.yml deployed them (create.yml's port in place of the template)."""
    with open(SERVICES_FILE) as handle:
        return [dict(entry, port_base=ports()[0]) for entry in yaml.safe_load(handle)["inference_service_list"]]


def test_a_removal_leaves_nothing_of_ours(request):
    entries = _entries()
    # Each entry as converge.yml deployed it (its port, create.yml's, in place of the template), marked absent.
    removal = {"inference_service_list": [dict(entry, state="absent") for entry in entries],
               "numa_host_state": "absent"}
    run = site("-e", json.dumps(removal))
    # The deployment back, so the other checks hold in any order.
    request.addfinalizer(converge)
    assert run.returncode == 0, run.stdout[-3000:]
    left = differences(fresh_snapshot(), snapshot(), ignore=CONVERGE_OWN + SYSTEMD_OWN)
    assert left == [], "the removal left these changes since the fresh container:\n%s" % "\n".join(left)
    # A second removal has nothing left to remove.
    again = site("-e", json.dumps(removal))
    assert again.returncode == 0, again.stdout[-3000:]
    assert " changed=0 " in again.stdout, again.stdout[-3000:]


def test_a_failed_first_deployment_leaves_nothing():
    # A new service whose server exits at once: its account is made, its unit and plan written and started, its
    # gate fails, and all of it is taken back; the stand-in service, unchanged, is left running as it was.
    broken = {"name": "broken", "layout": "single", "node": 0, "model_size": "32M", "memory_headroom": "16M",
              "command": ["/usr/bin/python3", "-c", "import sys; sys.exit('failed to load model')"]}
    before = snapshot()
    run = site("-e", json.dumps({"inference_service_list": _entries() + [broken]}),
               "-e", "inference_service_ready_seconds=60")
    assert run.returncode != 0, run.stdout[-3000:]
    assert "broken@0.service" in run.stdout and "failed to load model" in run.stdout, run.stdout[-3000:]
    left = differences(before, snapshot(), ignore=TIMER_OWN + ["system-broken.slice"])
    assert left == [], "the failed first deployment left these changes:\n%s" % "\n".join(left)

