"""The plan record's home (decide/records): every name of the plan directory's records spelled once, and the role
takes the plan records' names from it rather than spelling a suffix by hand."""
import glob
import os
import re

import pytest

from ansible_collections.inferops.numa.plugins.filter.systemd_unit import FilterModule
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide import records, rollout

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLE = os.path.join(REPO, "roles", "inference_service")
# What the role once spelled by hand; decide/records holds each of them now.
SUFFIXES = re.compile(r"\.plan\.json|\.audit\.json|\.rejected|\.created|\.previous|rollout\.pending|ab-gates")


def test_each_record_is_named_as_the_readers_and_writers_name_it():
    assert records.plan_record_name("llama", 1) == "llama@1.plan.json"
    assert records.plan_record_name("llama", "*") == "llama@*.plan.json"
    assert records.audit_record_name("llama") == "llama.audit.json"
    assert records.rejected_record_name("llama") == "llama.rejected.json"
    assert (records.PENDING, records.AB_GATES) == ("rollout.pending.json", "ab-gates.json")


def test_a_plan_record_name_splits_back_at_its_last_at_sign():
    assert records.plan_record_parts("a@b@07.plan.json") == ("a@b", "07")
    assert records.plan_record_unit("llama@12.plan.json", "/p") == ("llama", 12)
    for name in ("llama@.plan.json", "llama@1x.plan.json", "llama.audit.json", "llama@1.plan.json.plan.json"):
        assert records.plan_record_parts(name) is None
    with pytest.raises(NumaError, match="not named <service>@<index>.plan.json"):
        records.plan_record_unit("llama@07.plan.json", "/p")


def test_what_a_deployment_writes_is_named_here():
    entry = {"pin_mode": "wrapper", "min_local_percent": 99, "pages": "all", "audit": True, "on_drift": "none"}
    wanted = rollout.rollout_service(entry, "llama", "[Unit]\n", [{"port": 8080}], [], "/u", "/p")
    paths = [item["path"] for item in wanted["files"]]
    assert os.path.join("/p", records.plan_record_name("llama", 0)) in paths
    assert os.path.join("/p", records.audit_record_name("llama")) in paths


def test_the_filter_is_the_function():
    assert FilterModule().filters()["numa_plan_record_name"].__wrapped__ is records.plan_record_name


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROLE, "tasks", "*.yml"))
                                        + glob.glob(os.path.join(ROLE, "templates", "*.j2"))),
                         ids=os.path.basename)
def test_the_role_spells_no_record_name_by_hand(path):
    with open(path, encoding="utf-8") as handle:
        found = [line.strip() for line in handle if SUFFIXES.search(line)]
    assert found == [], "use the filter inferops.numa.numa_plan_record_name (decide/records)"
