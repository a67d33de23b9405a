"""promtool checks the alerting rules and runs their unit tests."""

import subprocess

from tests.integration.test_metrics_processes import promtool
from tests.unit.test_monitoring import MONITORING, RULES


def promtool_run(*args):
    done = subprocess.run([promtool()] + list(args), cwd=MONITORING, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout
    return done.stdout


def test_promtool_checks_the_rules():
    assert "SUCCESS: 4 rules found" in promtool_run("check", "rules", RULES)


def test_each_alert_fires_on_what_should_fire_it():
    assert "SUCCESS" in promtool_run("test", "rules", "inferops_numa_rules_test.yml")
