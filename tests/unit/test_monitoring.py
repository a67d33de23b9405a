"""The alert rules and the Grafana dashboard shipped in monitoring/: promtool checks and tests the rules, and
every metric they and the dashboard query is one numa-pin metrics writes."""

import json
import os
import re

import pytest
import yaml

from ansible_collections.inferops.numa.plugins.module_utils.numa.watch import exposition, metrics


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MONITORING = os.path.join(REPO, "monitoring")
RULES = os.path.join(MONITORING, "inferops_numa_rules.yml")
DASHBOARD = os.path.join(MONITORING, "inferops_numa_dashboard.json")
NAME = re.compile(r"\binferops_numa_[a-z_]+\b")


def written_names():
    """Every family numa-pin metrics renders for a host with one measured instance."""
    instance = {"unit": "llama@0.service", "service": "llama", "policy": "bind", "nodes": "0", "up": True,
                "plan_age_seconds": 1.0, "min_local_percent": 99, "pages": "all", "drift": False,
                "affinity_match": True, "local_ratio": {"anon": 1.0, "file": 1.0, "judged": 1.0},
                "resident_bytes": {"anon": 1, "file": 1}, "remote_bytes": {"anon": 0, "file": 0}}
    counters = dict((name, 1) for name in metrics.NUMASTAT_COUNTERS)
    node = {"id": 0, "cpus": 2, "gpus": 0, "memory_total_bytes": 2, "memory_free_bytes": 1, "counters": counters}
    snapshot = {"host": {"numa_balancing": 0, "node_count": 1, "nodes": [node]}, "instances": [instance],
                "warnings": [], "timestamp_seconds": 1.0, "duration_seconds": 0.1}
    return set(re.findall(r"^# TYPE (\S+) ", exposition.render(snapshot), re.MULTILINE))


def dashboard_exprs():
    with open(DASHBOARD) as handle:
        dashboard = json.load(handle)
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    exprs.extend(variable["definition"] for variable in dashboard["templating"]["list"])
    return dashboard, exprs


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_queried_is_one_numa_pin_writes(source):
    if source == "rules":
        with open(RULES) as handle:
            rules = yaml.safe_load(handle)["groups"][0]["rules"]
        queried = set(name for rule in rules for name in NAME.findall(rule["expr"]))
    else:
        queried = set(name for expr in dashboard_exprs()[1] for name in NAME.findall(expr))
    assert queried and queried <= written_names(), queried - written_names()


def test_every_panel_queries_the_chosen_hosts_through_the_datasource_input():
    dashboard, _exprs = dashboard_exprs()
    assert dashboard["__inputs"][0]["name"] == "DS_PROMETHEUS"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}" and panel["title"] and panel["description"]
        for target in panel["targets"]:
            assert 'instance=~"$instance"' in target["expr"], target
