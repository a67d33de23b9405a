"""tests/phases.py, the `make test` runner: scheduling, the phase table, naming what failed."""
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "phases.py"
_spec = importlib.util.spec_from_file_location("phases", str(SCRIPT))
phases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(phases)


@pytest.fixture
def logs(tmp_path, monkeypatch):
    monkeypatch.setattr(phases, "LOGS", tmp_path)
    return tmp_path


def _phase(name, code, needs=(), background=False, sleep=0.0, after=()):
    script = "import time, sys; time.sleep(%r); print(%r); sys.exit(%d)" % (sleep, name + " ran", code)
    return phases.Phase(name, [sys.executable, "-c", script], needs, background, after=after)


def test_a_failed_need_skips_its_dependents_but_not_the_others(logs, capsys):
    plan = [_phase("setup", 0), _phase("build", 3, ["setup"], background=True),
            _phase("unit", 0, ["setup"]), _phase("lab", 0, ["setup", "build"])]
    for phase in plan:
        phase.log = logs / (phase.name + ".log")
    phases.schedule(plan)
    assert [p.status for p in plan] == ["ok", "FAILED (exit 3)", "ok", "skipped (needs build)"]
    assert "unit ran" in (logs / "unit.log").read_text()
    assert "unit ran" in capsys.readouterr().out  # foreground output reaches the console


def test_background_phases_overlap_the_foreground(logs):
    background, foreground = _phase("bg", 0, background=True, sleep=1.0), _phase("fg", 0, sleep=1.0)
    for phase in (background, foreground):
        phase.log = logs / (phase.name + ".log")
    phases.schedule([background, foreground])
    assert background.started < foreground.ended and foreground.started < background.ended
    assert background.status == foreground.status == "ok"


def test_after_orders_phases_without_needing_their_success(logs):
    first = _phase("first", 1, background=True, sleep=0.3)
    second = _phase("second", 0, background=True, after=["first"])
    for phase in (first, second):
        phase.log = logs / (phase.name + ".log")
    phases.schedule([first, second])
    assert second.started >= first.ended
    assert (first.status, second.status) == ("FAILED (exit 1)", "ok")


def test_phases_find_the_venvs_tools_first_on_path(logs, tmp_path, monkeypatch):
    # molecule runs `pytest` by name: a pyenv shim's bin dir ahead of the venv hid testinfra.
    venv_bin, other_bin = tmp_path / "venv" / "bin", tmp_path / "pyenv" / "bin"
    for directory, who in ((venv_bin, "venv"), (other_bin, "pyenv")):
        directory.mkdir(parents=True)
        tool = directory / "pytest"
        tool.write_text("#!/bin/sh\necho %s pytest\n" % who)
        tool.chmod(0o755)
    monkeypatch.setattr(phases, "VENV_BIN", venv_bin)
    monkeypatch.setenv("PATH", "%s:%s:/usr/bin:/bin" % (other_bin, venv_bin))
    for background in (False, True):
        phase = phases.Phase("which", ["sh", "-c", "pytest; echo $VIRTUAL_ENV"], background=background)
        phase.log = logs / "which.log"
        phases.schedule([phase])
        assert phase.status == "ok"
        assert "venv pytest\n%s\n" % venv_bin.parent in phase.log.read_text()


def test_niced_phases_run_under_nice():
    phase = phases.Phase("unit", ["pytest"], nice=10)
    assert phase.argv == ["nice", "-n", "10", "pytest"]


def test_foreground_phases_run_one_at_a_time_in_order(logs):
    plan = [_phase("first", 0, sleep=0.3), _phase("second", 0)]
    for phase in plan:
        phase.log = logs / (phase.name + ".log")
    phases.schedule(plan)
    assert plan[1].started >= plan[0].ended


def test_table_lists_every_phase_with_its_wall_time(logs):
    done = phases.Phase("unit", ["true"])
    done.started, done.ended, done.status = 100.0, 165.0, "ok"
    skipped = phases.Phase("molecule", ["true"], ["unit"])
    skipped.status = "skipped (needs image)"
    text = phases.table([done, skipped], origin=90.0)
    assert "unit" in text and "0:10" in text and "1:05" in text
    assert "molecule" in text and "skipped (needs image)" in text


@pytest.mark.parametrize("log, expected", [
    ("....F\nFAILED tests/unit/test_x.py::test_y - assert 1 == 2\n", ["test tests/unit/test_x.py::test_y"]),
    ("TASK [Install the helper] ***\nfatal: [numa-lab]: FAILED! => {}\n",
     ["task 'Install the helper' on numa-lab"]),
    ("ERROR: plugins/modules/x.py:3:1: E501 line too long\n", ["plugins/modules/x.py:3:1: E501 line too long"]),
    ("\x1b]8;;https://docs.ansible.com/lint/rules/yaml/\x1b\\yaml[indentation]\x1b]8;;\x1b\\: Wrong indentation\n"
     "roles/a/tasks/main.yml:7\n", ["yaml[indentation] roles/a/tasks/main.yml:7"]),
    ("\x1b[31myaml[commas]\x1b[0m: Too few spaces after comma\n\x1b[35mroles/numa_host/tasks/numad.yml\x1b[0m:5\n",
     ["yaml[commas] roles/numa_host/tasks/numad.yml:5"]),
    ("  \u2502 TASK [Install the helper] ***\n  \u2502 fatal: [numa-lab]: FAILED! => {}\n",
     ["task 'Install the helper' on numa-lab"]),
    ("compiling\nbuild_server: pip download failed\n", ["build_server: pip download failed"]),
    # molecule's box around testinfra's summary, wrapped at 80 columns
    ("  \u2502 =========== short test summary info\n  \u2502   ============\n  \u2502 FAILED\n"
     "  \u2502   tests/test_lab.py::test_oversized_instance_is_interleaved_evenly[ansible:/\n"
     "  \u2502   /numa-lab]\n  \u2502 =========== 1 failed, 31 passed in 598.71s (0:09:58)\n"
     "default : actions=7  successful=5  failed=1\n",
     ["test tests/test_lab.py::test_oversized_instance_is_interleaved_evenly[ansible://numa-lab]"]),
])
def test_failing_checks_are_named_from_the_log(log, expected):
    assert phases.failing_checks(log) == expected


def test_report_names_the_failed_phase_its_checks_and_its_log(logs, capsys):
    failed = phases.Phase("unit", ["false"])
    failed.log = logs / "unit.log"
    failed.log.write_text("FAILED tests/unit/test_x.py::test_y - boom\n")
    failed.started, failed.ended, failed.status = 0.0, 1.0, "FAILED (exit 1)"
    assert phases.report([failed], origin=0.0) == 1
    out = capsys.readouterr().out
    assert "unit failed; log:" in out and "test tests/unit/test_x.py::test_y" in out
    assert (logs / "phases.txt").read_text().startswith("phase")


def test_a_quiet_console_hears_what_the_running_phases_last_said(logs, capsys):
    script = "import time; print('step one', flush=True); time.sleep(1.5); print('step two', flush=True)"
    quiet = phases.Phase("build", [sys.executable, "-c", script], background=True)
    quiet.log = logs / "build.log"
    phases.schedule([quiet], heartbeat_seconds=0.5)
    beats = [line for line in capsys.readouterr().out.splitlines() if line.startswith("... ")]
    assert beats and all("build 0:0" in line for line in beats)
    assert any(line.endswith(": step one") for line in beats)


def test_the_heartbeat_shows_a_logs_last_line_without_terminal_codes_and_cut(logs):
    log = logs / "lab.log"
    log.write_text("TASK [first]\n\x1b[31m\u2502 TASK [Boot the lab guest and wait for SSH] \u2502\x1b[0m\n\n")
    assert phases.last_line(log) == "TASK [Boot the lab guest and wait for SSH]"
    log.write_text("x" * 500 + "\n")
    assert phases.last_line(log) == "x" * (phases.HEARTBEAT_LINE - 3) + "..."
    assert phases.last_line(logs / "missing.log") == ""


def test_make_test_runs_the_ansible_core_matrix_after_sanity():
    matrix = next(phase for phase in phases.phases() if phase.name == "matrix")
    assert matrix.background and matrix.after == ["sanity"] and "tests/matrix.py" in matrix.argv


def test_each_kind_of_tests_is_a_phase_of_its_own_one_after_another_shuffled_by_one_seed():
    plan = {phase.name: phase for phase in phases.phases(seed=4242)}
    kinds = [name for name, _ in phases.PYTEST_PHASES]
    assert kinds == ["unit", "docs", "tooling", "integration"]
    folders = [folder for _, paths in phases.PYTEST_PHASES for folder in paths]
    assert sorted(folders) == ["tests/conformance", "tests/docs", "tests/integration", "tests/tooling", "tests/unit"]
    for before, name in zip([None] + kinds, kinds):
        phase = plan[name]
        assert phase.background and phase.needs == ["venv"] and phase.after == ([before] if before else [])
        assert "--shuffle=4242" in phase.argv and phase.argv[0] == "nice"
    assert plan["lint"].after == ["integration"]


def test_the_seed_is_new_each_run_unless_one_is_given_to_replay(monkeypatch):
    assert phases.shuffle_seed({"INFEROPS_NUMA_SHUFFLE": "31337"}) == 31337
    assert 1 <= phases.shuffle_seed({}) < 10 ** 6
    with pytest.raises(SystemExit, match="INFEROPS_NUMA_SHUFFLE"):
        phases.shuffle_seed({"INFEROPS_NUMA_SHUFFLE": "soon"})


def test_phases_require_the_tools_make_test_installs():
    assert phases.phase_environment({"PATH": "/usr/bin"})["INFEROPS_NUMA_REQUIRE_TOOLS"] == "1"


@pytest.mark.parametrize("log, skipped", [
    ("....s\n1491 passed, 27 skipped in 366.43s (0:06:06)\n", 27),
    ("=== 3 failed, 2 passed, 1 skipped, 4 warnings in 1.20s ===\n", 1),
    ("12 passed in 0.50s\n", 0),
    # the matrix: one run per core, added up
    ("matrix: oldest\n430 passed, 2 skipped in 60.1s\nmatrix: newest\n431 passed, 3 skipped in 58.0s\n", 5),
    # molecule's box around testinfra's summary
    ("  \u2502 =========== 1 failed, 31 passed, 2 skipped in 598.71s (0:09:58)\n", 2),
    ("no tests ran in 0.01s\n", 0),
    ("ansible-lint: Passed: 0 failure(s), 0 warning(s) on 90 files.\n", None),
    ("interrupted before the summary: 3 skipped so far\n", None),
])
def test_the_skips_of_a_phase_come_from_pytests_summary_line(log, skipped):
    assert phases.pytest_skips(log) == skipped


def test_the_table_counts_each_phases_skips(logs):
    unit = phases.Phase("unit", ["true"])
    unit.started, unit.ended, unit.status, unit.skipped = 0.0, 30.0, "ok", 3
    lint = phases.Phase("lint", ["true"])
    lint.started, lint.ended, lint.status = 30.0, 60.0, "ok"
    rows = phases.table([unit, lint], origin=0.0).splitlines()
    assert rows[0].split() == ["phase", "started", "wall", "skipped", "result"]
    assert rows[1].split() == ["unit", "0:00", "0:30", "3", "ok"]
    assert rows[2].split() == ["lint", "0:30", "0:30", "-", "ok"]


def test_a_phase_says_how_many_tests_it_skipped_when_it_ends(logs, capsys):
    script = "print('1 passed, 2 skipped in 0.01s')"
    phase = phases.Phase("docs", [sys.executable, "-c", script], background=True)
    phase.log = logs / "docs.log"
    phases.schedule([phase])
    assert phase.skipped == 2
    assert "== docs: ok after 0:00, 2 skipped" in capsys.readouterr().out


def test_the_summary_gives_the_seed_to_replay_the_order(logs, capsys):
    done = phases.Phase("unit", ["true"])
    done.started, done.ended, done.status = 0.0, 1.0, "ok"
    assert phases.report([done], origin=0.0, seed=777) == 0
    assert "tests shuffled with seed 777 (replay: INFEROPS_NUMA_SHUFFLE=777 make test)" in capsys.readouterr().out


def test_the_lab_budget_report_is_quoted_only_when_this_run_wrote_it(tmp_path, monkeypatch):
    report = tmp_path / "lab-checks.txt"
    monkeypatch.setattr(phases, "LAB_CHECKS", report)
    assert phases.lab_budgets(0) == ""  # no lab run
    report.write_text("lab checks: 90 s of 100 s budgeted (0.90); 1 over budget\nratio ...\n"
                      + "".join("%d.00 check_%d\n" % (9 - n, n) for n in range(9)))
    quoted = phases.lab_budgets(report.stat().st_mtime - 1, lines=2).splitlines()
    assert quoted[0].startswith("lab checks: 90 s") and quoted[2:4] == ["9.00 check_0", "8.00 check_1"]
    assert len(quoted) == 5 and quoted[-1].startswith("(all of them: ")
    assert phases.lab_budgets(report.stat().st_mtime + 1) == ""  # an earlier run's


def test_each_lab_check_is_measured_against_its_own_budget():
    path = Path(__file__).resolve().parents[2] / "molecule" / "default" / "tests" / "conftest.py"
    spec = importlib.util.spec_from_file_location("lab_conftest", path)
    lab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lab)
    slow = next(iter(lab.CHECK_BUDGETS))
    assert lab.check_name("molecule/default/tests/test_x.py::%s[ansible://numa-lab]" % slow) == slow
    rows = lab.budget_rows({slow: lab.CHECK_BUDGETS[slow] * 0.5, "test_quick": lab.CHECK_S * 1.5}, 2.0)
    assert [(round(ratio, 2), name) for ratio, _took, _allowed, name in rows] == [(0.75, "test_quick"), (0.25, slow)]
    assert rows[0][2] == lab.CHECK_S * 2.0


def test_the_container_scenario_runs_beside_the_lab_niced_once_the_venv_is_there():
    plan = {phase.name: phase for phase in phases.phases()}
    container = plan["molecule-container"]
    assert container.background and container.needs == ["venv"] and container.argv[:3] == ["nice", "-n", "10"]
    assert container.argv[-3:] == ["test", "-s", "container"]
    # The lab's phase runs only the default scenario, not this one a second time.
    assert plan["molecule"].argv[-1] == "test"
