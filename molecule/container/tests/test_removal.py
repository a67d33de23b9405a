"""A removal leaves the container as create.yml found it: site.yml with the stand-in service's entry at
``state: absent`` and ``numa_host_state: absent`` (the roles' removal, issue 43), compared with the snapshot of the
fresh container.

PENDING the removal: until the roles take ``state`` and ``numa_host_state``, the preflight refuses both keys ("no
such key") and this check skips saying so; it goes live, unchanged, once they are merged.
"""

import json

import pytest
import yaml

from conftest import CONVERGE_OWN, SERVICES_FILE, converge, differences, fresh_snapshot, ports, site, snapshot

PENDING = ("state: no such key", "numa_host_state: no such key")
# systemd's own, left by a removal done by hand (services stopped and disabled, files, user and group removed, daemon
# reloaded) in this container: the slice systemd made for the template's instances, empty once they stopped, and the
# target the service's unit pulled in (Wants=network-online.target), which stays reached. Neither holds anything.
SYSTEMD_OWN = ["system-standin.slice", "network-online.target"]


def test_a_removal_leaves_nothing_of_ours(request):
    with open(SERVICES_FILE) as handle:
        entries = yaml.safe_load(handle)["inference_service_list"]
    # Each entry as converge.yml deployed it (its port, create.yml's, in place of the template), marked absent.
    removal = {"inference_service_list": [dict(entry, state="absent", port_base=ports()[0]) for entry in entries],
               "numa_host_state": "absent"}
    run = site("-e", json.dumps(removal))
    if run.returncode != 0 and any(refusal in run.stdout for refusal in PENDING):
        pytest.skip("pending the removal (issue 43): the preflight refuses state / numa_host_state as unknown keys")
    # The deployment back, so the other checks hold in any order.
    request.addfinalizer(converge)
    assert run.returncode == 0, run.stdout[-3000:]
    left = differences(fresh_snapshot(), snapshot(), ignore=CONVERGE_OWN + SYSTEMD_OWN)
    assert left == [], "the removal left these changes since the fresh container:\n%s" % "\n".join(left)
    # A second removal has nothing left to remove.
    again = site("-e", json.dumps(removal))
    assert again.returncode == 0, again.stdout[-3000:]
    assert " changed=0 " in again.stdout, again.stdout[-3000:]
