"""judging.OPTIONS, the one table of how an audit judges pages, against everything that spells it out: the
role's entry options, numa-pin audit's flags and the metrics' per-service defaults (numa_audit's DOCUMENTATION is
held to its argument spec, built from the table, by test_doc_fragments.py)."""

import os

import pytest
import yaml

from ansible_collections.inferops.numa.plugins.module_utils.numa.cli import numa_pin
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs import judging
from ansible_collections.inferops.numa.plugins.module_utils.numa.watch import metrics
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _spelled(entry):
    return {"default": entry.get("default"), "choices": list(entry["choices"]) if entry.get("choices") else None}


def _table():
    return {option.name: {"default": option.default, "choices": list(option.choices) if option.choices else None}
            for option in judging.OPTIONS}


def test_the_table_has_one_default_each():
    assert _table() == {"min_local_percent": {"default": 99.0, "choices": None},
                        "pages": {"default": "all", "choices": ["all", "anon", "file"]}}


def test_the_roles_entries_spell_the_table():
    with open(os.path.join(REPO, "roles", "inference_service", "meta", "argument_specs.yml")) as handle:
        spec = yaml.safe_load(handle)["argument_specs"]["main"]["options"]["inference_service_list"]["options"]
    assert {name: _spelled(spec[name]) for name in _table()} == _table()


def test_numa_pin_audit_takes_the_table_with_its_defaults():
    args, _ = numa_pin._parse(["audit", "--pid", "1"])
    assert (args.min_local_percent, args.pages) == (99.0, "all")
    args, _ = numa_pin._parse(["audit", "--pid", "1", "--min-local-percent", "97.5", "--pages", "anon"])
    assert (args.min_local_percent, args.pages) == (97.5, "anon")


def test_the_metrics_judge_by_the_tables_defaults():
    assert {name: metrics.DEFAULT_SETTINGS[name] for name in _table()} == judging.DEFAULTS


@pytest.mark.parametrize("threshold", [float("nan"), float("inf"), -1, 100.5, "99", True, None])
def test_a_threshold_no_share_compares_with_is_refused(threshold):
    with pytest.raises(NumaError, match="min_local_percent .* is not a percentage from 0 to 100"):
        judging.check(threshold, "all")


def test_pages_outside_the_choices_are_refused_naming_them():
    with pytest.raises(NumaError, match="pages must be one of all, anon, file, not 'code'"):
        judging.check(99, "code")
    judging.check(0, "file")
    judging.check(10 ** 400 // 10 ** 398, "anon")
