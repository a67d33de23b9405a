"""tests/matrix.py, the ansible-core matrix: which tests it runs, which Pythons it takes, and that its oldest
core is the floor meta/runtime.yml claims."""

import os
import re

import pytest

from tests import matrix

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_oldest_core_is_the_floor_of_requires_ansible():
    with open(os.path.join(REPO, "meta", "runtime.yml")) as handle:
        runtime = handle.read()
    matrix.check_floor(runtime)
    with pytest.raises(matrix.MatrixError, match="requires ansible-core >=2.16 but the matrix's oldest core is 2.14"):
        matrix.check_floor('requires_ansible: ">=2.16.0"\n')
    with pytest.raises(matrix.MatrixError, match="no requires_ansible"):
        matrix.check_floor("plugin_routing: {}\n")


def test_readme_states_the_support_table_of_the_matrix():
    with open(os.path.join(REPO, "README.md")) as handle:
        readme = handle.read()
    assert "requires_ansible: \">=%s.0\"" % matrix.floor(open(os.path.join(REPO, "meta", "runtime.yml")).read()) \
        in readme
    for core in matrix.CORES:
        assert re.search(r"^\|[^|\n]*%s[^|\n]*\|" % re.escape(core.version), readme, re.MULTILINE), core.version


def test_the_test_tools_are_the_unit_phases_pins():
    with open(os.path.join(REPO, "requirements.txt")) as handle:
        pins = matrix.tool_pins(handle.read())
    assert [pin.split("==")[0] for pin in pins] == list(matrix.TEST_TOOLS)
    with pytest.raises(matrix.MatrixError, match="pins no hypothesis"):
        matrix.tool_pins("pytest==9.2.0\n")


def test_every_test_module_that_runs_ansible_is_chosen_and_no_other(tmp_path):
    unit = tmp_path / "tests" / "unit"
    integration = tmp_path / "tests" / "integration"
    conformance = tmp_path / "tests" / "conformance"
    for folder in (unit, integration, tmp_path / "tests" / "docs", tmp_path / "tests" / "tooling", conformance):
        folder.mkdir(parents=True)
    (unit / "test_module.py").write_text("from tests.ansible_compat import patch_module_args\n")
    (integration / "test_adhoc.py").write_text("x = ansible_command('ansible')\n")
    (unit / "test_core.py").write_text("from ansible.module_utils.basic import AnsibleModule\n")
    (unit / "test_reuse.py").write_text("from tests.integration.test_adhoc import helper\n")
    (tmp_path / "tests" / "docs" / "test_reuse_again.py").write_text("from tests.unit.test_reuse import other\n")
    (unit / "test_pure.py").write_text("from ansible_collections.inferops.numa.plugins.module_utils.numa import x\n"
                                       "# runs no ansible-playbook\n")
    (tmp_path / "tests" / "tooling" / "test_same_name.py").write_text("from tests.unit.test_pure import x\n")
    (conformance / "test_corpus.py").write_text("x = ansible_command('ansible-playbook')\n")
    assert matrix.ansible_test_files(tmp_path) == [
        "tests/docs/test_reuse_again.py", "tests/integration/test_adhoc.py", "tests/unit/test_core.py",
        "tests/unit/test_module.py", "tests/unit/test_reuse.py"]


def test_the_real_selection_holds_the_module_role_and_docs_tests_but_not_the_planner_properties():
    chosen = matrix.ansible_test_files()
    for path in ("unit/test_facts_plan_modules", "integration/test_facts_plan_modules_processes",
                 "integration/test_units_processes", "integration/test_unit_roundtrip", "docs/test_docs",
                 "docs/test_readme", "integration/test_request_processes", "tooling/test_collection_build"):
        assert "tests/%s.py" % path in chosen, path
    assert "tests/unit/test_placement_properties.py" not in chosen
    assert not [path for path in chosen if path.startswith("tests/conformance/")]


def test_a_pyenv_shim_is_never_taken_for_a_python(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", os.pathsep.join(["/root/.pyenv/shims", str(tmp_path / "bin")]))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    build = tmp_path / "pyenv" / "versions" / "3.12.1" / "bin"
    build.mkdir(parents=True)
    (build / "python3.12").write_text("")
    (tmp_path / "pyenv" / "versions" / "3.11.7" / "bin").mkdir(parents=True)
    (tmp_path / "pyenv" / "versions" / "3.11.7" / "bin" / "python3.11").write_text("")
    candidates = matrix.python_candidates("3.12")
    assert candidates[0] == "/usr/bin/python3.12"
    assert str(tmp_path / "bin" / "python3.12") in candidates
    assert str(build / "python3.12") == candidates[-1]
    assert not any("shims" in candidate for candidate in candidates)


def test_a_core_without_its_python_fails_naming_the_fix(monkeypatch):
    monkeypatch.setattr(matrix, "python_candidates", lambda version: [])
    with pytest.raises(matrix.NoPython, match=r"needs Python 3\.12 or 3\.13, and none is installed: install one "
                                              r"\(pyenv install 3\.12"):
        matrix.find_python(matrix.Core("newest", "2.21.5", ("3.12", "3.13"), ""))


def test_a_core_without_its_python_is_not_run_and_the_phase_table_says_so(monkeypatch):
    import io

    from tests import phases

    monkeypatch.setattr(matrix, "python_candidates", lambda version: [])
    log = io.StringIO()
    row = matrix.run_core(matrix.Core("newest", "2.21.5", ("3.12", "3.13"), ""), [], [], log)
    assert row["result"].startswith("not run: ansible-core 2.21.5 (newest) needs Python 3.12 or 3.13")
    assert phases.phase_notes(log.getvalue()) == ["newest core 2.21.5 not run: no Python 3.12 or 3.13 here"]
    assert "matrix: newest: NOT RUN: " in log.getvalue()
