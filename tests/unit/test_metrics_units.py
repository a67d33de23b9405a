"""numa_host's metrics service and timer as the role renders them: systemd reads them without a complaint, and the
service runs numa-pin metrics with the role's directories and interval, each an argument of its own."""

import os
import shlex
import shutil

import importlib

import jinja2
import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLE = os.path.join(REPO, "roles", "numa_host")
ANALYZE = shutil.which("systemd-analyze")


def render(name, **overrides):
    with open(os.path.join(ROLE, "defaults", "main.yml")) as handle:
        variables = yaml.safe_load(handle)
    variables.update(overrides)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(ROLE, "templates")), trim_blocks=True,
                             undefined=jinja2.StrictUndefined)
    # Imported when a test runs, not at collection: see test_fleet_report.report_filter.
    plugin = importlib.import_module("ansible_collections.inferops.numa.plugins.filter.systemd_unit")
    env.filters.update(("inferops.numa." + key, value) for key, value in plugin.FilterModule().filters().items())
    return env.get_template(name).render(**variables)


def setting(text, key):
    values = [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(key + "=")]
    assert len(values) == 1, (key, values)
    return values[0]


def test_the_service_runs_numa_pin_metrics_with_the_roles_settings():
    text = render("inferops-numa-metrics.service.j2", numa_host_metrics_dir="/srv/textfile-100%",
                  numa_host_metrics_drift_interval_seconds=600)
    assert shlex.split(setting(text, "ExecStart").replace("%%", "%")) == [
        "/usr/local/bin/numa-pin", "metrics", "--textfile-dir", "/srv/textfile-100%", "--plan-dir", "/etc/inferops-numa",
        "--state-dir", "/var/lib/inferops-numa", "--drift-interval", "600"]
    assert setting(text, "Type") == "oneshot" and setting(text, "StateDirectory") == "inferops-numa"


def test_a_directory_systemd_would_split_is_refused_naming_the_variable():
    with pytest.raises(Exception, match="numa_host_metrics_dir '/srv/text files' must be an absolute path"):
        render("inferops-numa-metrics.service.j2", numa_host_metrics_dir="/srv/text files")


def test_the_timer_fires_every_period_to_the_second():
    text = render("inferops-numa-metrics.timer.j2", numa_host_metrics_period_seconds=15)
    assert setting(text, "OnUnitActiveSec") == "15s" and setting(text, "AccuracySec") == "1s"
