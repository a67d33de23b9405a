"""The roofline of each instance: its memory-bandwidth bound on tokens/s, its measured share of it, the metrics that
carry both and the fleet report's flag on an instance far below its peers."""

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.decide import roofline
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.weights import Bandwidths
from ansible_collections.inferops.numa.plugins.module_utils.numa.watch import exposition, metrics
from ansible_collections.inferops.numa.plugins.plugin_utils import fleet_report

GB = 10 ** 9
# numa_cost's figures (GB/s): node 1 is slower, as a CXL expander or a half-populated socket is.
MEASURED = Bandwidths("measured", {0: 100.0, 1: 50.0}, "")


@pytest.mark.parametrize("policy, nodes, bound", [
    ("bind", [0], 10.0),                    # 100 GB/s / 10 GB per token
    ("bind", [1], 5.0),
    ("interleave", [0, 1], 10.0),           # equal shares: the slower node sets the pace, 2 x 50 GB/s
    ("weighted_interleave", [0, 1], 15.0),  # shares by bandwidth: 150 GB/s
])
def test_the_bound_is_the_plans_memory_bandwidth_over_the_bytes_a_token_reads(policy, nodes, bound):
    assert roofline.bound_tokens_per_second(MEASURED, policy, nodes, 10 * GB) == pytest.approx(bound)


def test_a_known_bandwidth_model_size_and_rate_give_the_share():
    found = roofline.roofline(MEASURED, "", "bind", [0], 10 * GB, 5.5)
    assert found == {"bound_tokens_per_second": 10.0, "share": 0.55, "source": "measured", "bytes_per_token": 10 * GB,
                     "reason": ""}
    # HMAT's figures are MB/s: 20000 MB/s over a 2 GB model is 10 tokens/s.
    hmat = roofline.roofline(Bandwidths("hmat", {0: 20000.0}, ""), "", "bind", [0], 2 * GB, 5.0)
    assert (hmat["bound_tokens_per_second"], hmat["share"]) == (10.0, 0.5)


@pytest.mark.parametrize("bandwidths, nodes, size, rate, reason", [
    (None, [0], 10 * GB, 5.0, "no bandwidth of the host's memory nodes: hmat: none"),
    (MEASURED, [0], None, 5.0, "no model size in the plan record"),
    (MEASURED, [2], 10 * GB, 5.0, "node(s) 2 of the plan have no bandwidth figure"),
    (MEASURED, [0], 10 * GB, None, "no measured tokens/s"),
])
def test_what_is_missing_is_named_and_nothing_is_guessed(bandwidths, nodes, size, rate, reason):
    found = roofline.roofline(bandwidths, "hmat: none", "bind", nodes, size, rate)
    assert found["share"] is None and found["reason"].startswith(reason)


def test_only_an_instance_under_half_the_typical_share_is_flagged_and_only_among_peers():
    shares = {"a": 0.55, "b": 0.5, "c": 0.2, "d": 0.6}
    assert roofline.far_below(shares) == ["c"]
    assert roofline.far_below({"a": 0.55, "c": 0.1}) == []


def test_the_metrics_take_hmats_bandwidth_where_no_measurement_was_recorded(tmp_path):
    topology = {"nodes": [{"id": 0, "has_memory": True, "hmat": {"read_bandwidth": 20000, "write_bandwidth": 30000}},
                          {"id": 1, "has_memory": True, "hmat": {"read_bandwidth": 20000, "write_bandwidth": 20000}}]}
    entry = {"unit": "llama@0.service", "service": "llama", "policy": "bind", "nodes": "0", "mem_nodes": [0],
             "bytes_per_token": 2 * GB, "tokens_per_second": 5.0}
    metrics.add_roofline(str(tmp_path), topology, [entry])
    assert (entry["roofline"]["source"], entry["roofline"]["bound_tokens_per_second"], entry["roofline"]["share"]) == (
        "hmat", 10.0, 0.5)
    families = {family.name: family.samples for family in exposition._instance_families(
        [dict(entry, up=False, plan_age_seconds=1, min_local_percent=99.0)], {})}
    assert families["inferops_numa_instance_roofline_tokens_per_second"][0][1] == 10.0
    assert families["inferops_numa_instance_roofline_ratio"][0][1] == 0.5


def test_the_fleet_report_shows_each_share_and_warns_about_the_one_far_below_its_peers():
    def result(*shares):
        return {"host": {"numa_balancing": 0, "node_count": 1, "cpu_count": 2, "gpu_count": 0, "nodes": []},
                "instances": [{"unit": "llama@%d.service" % index, "policy": "bind", "nodes": "0", "cpulist": "0-1",
                               "up": True, "roofline": {"bound_tokens_per_second": 10.0, "share": share,
                                                        "source": "measured", "reason": ""}}
                              for index, share in enumerate(shares)],
                "planned": [], "read_warnings": []}
    hostvars = {"a": {"fleet_report_result": result(0.55, 0.5)}, "b": {"fleet_report_result": result(0.2)}}
    model = fleet_report.numa_fleet_report(hostvars, ["a", "b"])
    (slow,) = [host for host in model["answered"] if host["name"] == "b"]
    assert slow["instances"][0]["roofline"] == "20.00 % of 10.0 tok/s"
    assert slow["warnings"] == ["llama@0.service runs at 20.00 % of its memory-bandwidth bound, under half the fleet's "
                                "typical 50.00 %: look for remote pages, stragglers or slow memory on this host"]
    assert [host["warnings"] for host in model["answered"] if host["name"] == "a"] == [[]]


def test_a_services_bytes_per_token_is_checked_converted_and_recorded_only_when_given():
    import json

    from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.rollout import rollout_service
    from ansible_collections.inferops.numa.plugins.plugin_utils import preflight

    service = {"name": "moe", "command": ["/srv/server"], "bytes_per_token": "12G"}
    (entry,), problems = preflight.check_entries([service], {})
    assert problems == [] and entry["bytes_per_token"] == 12 * 1024 ** 3
    for bad in ("0", "lots", -5):
        assert "bytes_per_token: " in preflight.check_entries([dict(service, bytes_per_token=bad)], {})[1][0]

    def audit_record(given):
        files = rollout_service(given, "moe", "[Service]\n", [], [], "/etc/systemd/system", "/etc/inferops-numa")
        (record,) = [json.loads(item["content"]) for item in files["files"] if item["path"].endswith(".audit.json")]
        return record
    assert audit_record(entry)["bytes_per_token"] == 12 * 1024 ** 3
    assert "bytes_per_token" not in audit_record(dict(entry, bytes_per_token=None))
