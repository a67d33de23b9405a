"""The report playbooks name their variables and pages alike: fleet_report.yml takes fleet_report_dir and writes
fleet_report.{md,html}; cost_report.yml takes cost_report_dir and cost_report_hosts and writes cost_report.{md,html}.
The cost playbook's names before 1.0.0 (numa_cost_report_dir, numa_cost_hosts) still work, with a deprecation
warning; the new names give none. One unreachable host is enough: the report is written for it too.
"""

from tests.integration.test_hostile_hosts import run_playbook

DOWN = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1,
        "ansible_ssh_common_args": "-o ConnectTimeout=5"}
HOSTS = {"down-1": DOWN, "down-2": dict(DOWN)}


def _deprecations(output):
    return [line for line in output.splitlines() if "DEPRECATION WARNING" in line]


def test_the_cost_reports_variables_are_named_as_the_fleet_reports(tmp_path):
    output = run_playbook(tmp_path, "cost_report.yml", HOSTS,
                          ["-e", "cost_report_dir=new", "-e", "cost_report_hosts=down-2"])
    markdown = (tmp_path / "new" / "cost_report.md").read_text()
    assert "1 host(s), 0 host type(s), 1 without a result." in markdown and "down-2" in markdown
    assert _deprecations(output) == []


def test_the_cost_reports_old_variable_names_still_work_and_say_they_are_deprecated(tmp_path):
    output = run_playbook(tmp_path, "cost_report.yml", HOSTS,
                          ["-e", "numa_cost_report_dir=old", "-e", "numa_cost_hosts=down-1"])
    markdown = (tmp_path / "old" / "cost_report.md").read_text()
    assert "1 host(s), 0 host type(s), 1 without a result." in markdown and "down-1" in markdown
    # The callback may wrap a long warning: the names are looked for in the whole output.
    flat = " ".join(output.split())
    assert len(_deprecations(output)) == 2, output[-3000:]
    assert "numa_cost_report_dir is cost_report_dir" in flat and "numa_cost_hosts is cost_report_hosts" in flat


def test_the_new_name_wins_over_the_old_one(tmp_path):
    output = run_playbook(tmp_path, "cost_report.yml", HOSTS,
                          ["-e", "numa_cost_report_dir=old", "-e", "cost_report_dir=new"])
    assert (tmp_path / "new" / "cost_report.md").is_file() and not (tmp_path / "old").exists()
    assert "cost_report_dir is set too and wins" in " ".join(output.split())


def test_the_fleet_report_writes_pages_named_as_its_playbook(tmp_path):
    output = run_playbook(tmp_path, "fleet_report.yml", HOSTS, ["-e", "fleet_report_dir=report"])
    assert sorted(path.name for path in (tmp_path / "report").iterdir()) == ["fleet_report.html", "fleet_report.md"]
    assert _deprecations(output) == []
