"""systemd-analyze reads the metrics service and timer the numa_host role renders."""

import subprocess

import pytest

from tests.tools import needs
from tests.unit.test_metrics_units import ANALYZE, render


@needs(ANALYZE is None, "systemd-analyze is not installed")
def test_systemd_reads_both_units_without_a_complaint(tmp_path):
    helper = tmp_path / "numa-pin"
    helper.write_text("#!/bin/sh\n")
    helper.chmod(0o755)
    for suffix in ("service", "timer"):
        (tmp_path / ("inferops-numa-metrics." + suffix)).write_text(
            render("inferops-numa-metrics.%s.j2" % suffix, numa_host_helper_path=str(helper),
                   numa_host_metrics_dir=str(tmp_path)))
    done = subprocess.run([ANALYZE, "verify", "--man=no", str(tmp_path / "inferops-numa-metrics.timer"),
                           str(tmp_path / "inferops-numa-metrics.service")], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=120, check=False)
    complaints = [line for line in done.stdout.splitlines() if "inferops-numa-metrics" in line]
    assert done.returncode == 0 and not complaints, done.stdout
