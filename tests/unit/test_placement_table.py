"""The placement table (module_utils/numa/watch/table.py): its columns, a hostile host's text kept on its line, a
dry run's plans, a missing rate; and the one function `make demo`, the role's filter and numa_audit all print with."""

import importlib.util
import json
import os

import pytest

from ansible_collections.inferops.numa.plugins.filter import numa_placement_table as table_filter
from ansible_collections.inferops.numa.plugins.module_utils.numa.watch import table
from ansible_collections.inferops.numa.plugins.modules import numa_audit
from tests.tools import REPO

PLAN = {"mem_nodes": [1], "cpulist": "28-55,84-111", "policy": "bind", "threads": 28, "port": 8081}


def _service(plan=None, unit="llama@1.service", record="/etc/inferops-numa/llama@1.plan.json"):
    """A service as the role queues it for numa_rollout: its plan is the text of its record among its files."""
    return {"name": "llama", "files": [{"path": record, "content": json.dumps(plan or PLAN) + "\n"}],
            "instances": [{"unit": unit, "record": record}]}


def _cells(line, header):
    """{column: cell} of one line, cut at the header's column starts."""
    starts = [header.index(name) for name in table.COLUMNS] + [None]
    return {name: line[starts[i]:starts[i + 1]].strip() for i, name in enumerate(table.COLUMNS)}


def test_the_columns_are_the_demos_in_its_order_and_padded_to_the_widest_cell():
    lines = table.placement_table([
        {"instance": "llama@0", "plan": dict(PLAN, mem_nodes=[0, 2], port=8080),
         "audit": {"local_percent": 99.987, "file_local_percent": 100}, "tokens_per_second": 13.66},
        {"instance": "llama@1", "plan": PLAN, "audit": {"local_percent": 42.0}, "tokens_per_second": None}])
    header = lines[0]
    assert header == "instance  node(s)  cpus          policy  threads  local pages  model pages local  port  tokens/s"
    assert tuple(table.COLUMNS) == ("instance", "node(s)", "cpus", "policy", "threads", "local pages",
                                    "model pages local", "port", "tokens/s")
    assert _cells(lines[1], header) == {
        "instance": "llama@0", "node(s)": "0,2", "cpus": "28-55,84-111", "policy": "bind", "threads": "28",
        "local pages": "99.99 %", "model pages local": "100.00 %", "port": "8080", "tokens/s": "13.7"}
    assert _cells(lines[2], header)["local pages"] == "42.00 %"
    # Every column starts where its header does: each cell is padded to the column's widest.
    assert lines[1].index("28-55") == lines[2].index("28-55") == header.index("cpus")
    assert lines[1].index("8080") == header.index("port")


def test_a_missing_rate_and_a_rate_that_is_no_number_show_a_dash():
    rows = [{"instance": "a@%d" % i, "plan": PLAN, "audit": None, "tokens_per_second": rate}
            for i, rate in enumerate([None, float("nan"), "fast", True])]
    lines = table.placement_table(rows)
    assert [_cells(line, lines[0])["tokens/s"] for line in lines[1:]] == ["-"] * 4


@pytest.mark.parametrize("verdict, rate", [
    ({"kept": True, "before_tokens_per_second": 8.3, "after_tokens_per_second": 13.7}, 13.7),
    # Rolled back: the placement left running is the one before the change.
    ({"kept": False, "before_tokens_per_second": 8.3, "after_tokens_per_second": 4.1}, 8.3),
    ({"kept": True, "after_tokens_per_second": float("inf")}, None),
    ({"kept": True}, None), (None, None), ("kept", None)])
def test_the_gates_rate_is_the_one_of_the_placement_it_left_running(verdict, rate):
    assert table.gate_rate(verdict) == rate


def test_a_hostile_hosts_text_stays_one_escaped_line_in_its_cell():
    evil = "llama@0\n\x1b[2J\r\u202eevil"
    lines = table.placement_table([{"instance": evil, "plan": dict(PLAN, cpulist="0-3\nforged  row",
                                                                  mem_nodes=["1\x07"], policy="bind\t"),
                                    "audit": None, "tokens_per_second": None}])
    assert len(lines) == 2 and all(line.isprintable() and line.isascii() for line in lines), lines
    cells = _cells(lines[1], lines[0])
    assert cells["instance"] == "llama@0\\n\\x1b[2J\\r\\u202eevil"
    assert cells["cpus"] == "0-3\\nforged  row" and cells["node(s)"] == "1\\x07" and cells["policy"] == "bind\\t"


def test_a_dry_runs_rows_are_the_plans_without_pages_or_rates():
    rows = table.rollout_rows([_service()])
    assert rows == [{"instance": "llama@1", "plan": PLAN, "audit": None, "tokens_per_second": None}]
    lines = table.placement_table(rows)
    cells = _cells(lines[1], lines[0])
    assert (cells["node(s)"], cells["cpus"], cells["threads"], cells["port"]) == ("1", "28-55,84-111", "28", "8081")
    assert (cells["local pages"], cells["model pages local"], cells["tokens/s"]) == ("-", "-", "-")


def test_a_deployments_rows_take_the_audit_and_the_gate_of_their_own_unit():
    services = [_service(), _service(dict(PLAN, mem_nodes=[0]), "llama@0.service",
                                     "/etc/inferops-numa/llama@0.plan.json")]
    audits = [{"unit": "llama@0.service", "ok": True, "local_percent": 100.0, "file_local_percent": 98.5},
              {"unit": "llama@1.service", "ok": False, "msg": "no memory"}]
    gates = {"llama@0.service": {"kept": True, "before_tokens_per_second": 8.0, "after_tokens_per_second": 12.0}}
    rows = table.rollout_rows(services, audits, gates)
    assert [(row["instance"], row["tokens_per_second"], (row["audit"] or {}).get("local_percent")) for row in rows] == [
        ("llama@1", None, None), ("llama@0", 12.0, 100.0)]


def test_a_record_that_is_no_json_object_shows_dashes_not_an_error():
    service = _service()
    service["files"][0]["content"] = "[1, 2"
    (row,) = table.rollout_rows([service])
    assert row["plan"] == {}
    assert _cells(table.placement_table([row])[1], table.placement_table([row])[0])["cpus"] == "-"


def _demo():
    spec = importlib.util.spec_from_file_location("inferops_lab_demo", os.path.join(REPO, "lab", "demo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_demo_the_roles_filter_and_the_audit_print_with_the_one_function(monkeypatch):
    assert _demo().placement_table is table.placement_table
    assert numa_audit.placement_table is table.placement_table
    calls = []
    monkeypatch.setattr(table, "placement_table", lambda rows: calls.append(list(rows)) or ["the one table"])
    assert table_filter.numa_placement_table([_service()]) == ["the one table"]
    assert calls == [table.rollout_rows([_service()])]
    assert table_filter.FilterModule().filters()["numa_placement_table"] is table_filter.numa_placement_table
