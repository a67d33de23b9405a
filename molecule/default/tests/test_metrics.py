"""The continuous proof in the dual-socket lab guest: numa_host's timer writes numa-pin metrics, Debian's
node_exporter serves them on :9100, and a change on the host shows up within one timer period.

The scraped text is read here with a parser of its own (the exposition format's lines), the bound instances
are found from the plan records the role wrote, and promtool (on the controller, `make apt` installs it)
checks the text.
"""

import json
import re
import shutil
import subprocess
import time

import pytest

from conftest import budget, labvm, wait_until

pytestmark = pytest.mark.usefixtures("two_nodes")

# converge.yml's numa_host_metrics_period_seconds.
PERIOD_S = 15
# Reference durations (seconds on the reference machine).
METRICS_RUN_S = 5         # one run of numa-pin metrics (every instance's numa_maps read) under TCG
SCRAPE_S = 10             # node_exporter answering a scrape
PREFIX = "inferops_numa_"
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(host):
    result = host.run("curl -sf --max-time %d http://localhost:9100/metrics" % budget(SCRAPE_S))
    assert result.rc == 0, "node_exporter did not answer on :9100: %s" % result.stderr
    return result.stdout


def ours(text):
    """[(name, labels, value)] of numa-pin's samples in a scrape."""
    found = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1).startswith(PREFIX):
            labels = dict(_LABEL.findall(match.group(2) or ""))
            found.append((match.group(1), labels, float(match.group(3))))
    return found


def value(samples, name, **labels):
    values = [v for n, found, v in samples if n == name and all(found.get(k) == w for k, w in labels.items())]
    return values[0] if len(values) == 1 else None


def bound_units(host):
    """unit -> pages its audit judges, for every instance whose plan record binds it."""
    listing = host.run("ls /etc/inferops-numa").stdout.split()
    units = {}
    for name in listing:
        match = re.match(r"^(.+)@(\d+)\.plan\.json$", name)
        if not match:
            continue
        plan = json.loads(host.file("/etc/inferops-numa/" + name).content_string)
        if plan.get("policy") == "bind":
            settings = json.loads(host.file("/etc/inferops-numa/%s.audit.json" % match.group(1)).content_string)
            units["%s@%s.service" % match.groups()] = settings["pages"]
    assert units, listing
    return units


def test_the_timer_and_node_exporter_run(host):
    assert host.run("systemctl is-active inferops-numa-metrics.timer prometheus-node-exporter.service").rc == 0
    timer = host.file("/etc/systemd/system/inferops-numa-metrics.timer").content_string
    assert "OnUnitActiveSec=%ds" % PERIOD_S in timer


def test_each_bound_instance_shows_its_locality_on_node_exporter(host):
    units = bound_units(host)

    def all_measured():
        samples = ours(scrape(host))
        return samples if all(value(samples, PREFIX + "instance_up", unit=unit) == 1 for unit in units) else None

    samples = wait_until(all_measured, PERIOD_S + METRICS_RUN_S, "every bound instance measured on :9100")
    for unit, pages in sorted(units.items()):
        judged = value(samples, PREFIX + "instance_judged_local_ratio", unit=unit, pages=pages)
        assert judged is not None and judged >= 0.99, (unit, judged)
        assert value(samples, PREFIX + "instance_drift", unit=unit) == 0, unit
        assert value(samples, PREFIX + "instance_affinity_match", unit=unit) == 1, unit
    assert value(samples, PREFIX + "nodes") == 2 and value(samples, PREFIX + "kernel_numa_balancing") == 0


def promtool_check(text):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed on the controller: make apt (Debian package prometheus)")
    return subprocess.run([promtool, "check", "metrics"], input=text, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=60, check=False)


def test_the_scraped_text_passes_promtool(host):
    text = scrape(host)
    whole = promtool_check(text)
    # node_exporter's own metrics break promtool's naming lint (node_memory_MemFree_bytes: exit 3); a text
    # it cannot parse is exit 1.
    assert whole.returncode in (0, 3) and "error while linting" not in whole.stdout, whole.stdout
    mine = "\n".join(line for line in text.splitlines()
                     if line.startswith(PREFIX) or line.startswith(("# HELP " + PREFIX, "# TYPE " + PREFIX))) + "\n"
    checked = promtool_check(mine)
    assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout
    assert mine.count("# TYPE ") >= 10


def test_reenabling_balancing_by_hand_shows_within_one_timer_period(host):
    def balancing_shown(wanted):
        return lambda: value(ours(scrape(host)), PREFIX + "kernel_numa_balancing") == wanted

    wait_until(balancing_shown(0), PERIOD_S + METRICS_RUN_S, "kernel_numa_balancing 0 on :9100")
    try:
        assert host.run("sysctl -w kernel.numa_balancing=1").rc == 0
        changed = time.monotonic()
        wait_until(balancing_shown(1), PERIOD_S + METRICS_RUN_S, "kernel_numa_balancing 1 on :9100", interval=1.0)
        # The next run starts within one period (AccuracySec=1s); on top of it, that run, a scrape and a poll, at
        # this guest's speed (the calibration without the waits' safety margin), twice over.
        speed = budget(1) / labvm.BUDGET_MARGIN
        elapsed = time.monotonic() - changed
        assert elapsed <= PERIOD_S + 2 * (speed * (METRICS_RUN_S + SCRAPE_S) + 1), elapsed
    finally:
        host.run("sysctl -w kernel.numa_balancing=0")
    wait_until(balancing_shown(0), PERIOD_S + METRICS_RUN_S, "kernel_numa_balancing back to 0 on :9100")
