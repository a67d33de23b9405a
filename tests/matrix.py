#!/usr/bin/env python3
"""The ansible-core matrix of `make test`: the tests that run Ansible, on the oldest and the newest core.

    tests/matrix.py            every core of CORES, one after another
    tests/matrix.py oldest     one of them

meta/runtime.yml's requires_ansible names the oldest core the collection supports; CORES holds that
core and the newest release, each with the Pythons it runs on (in order of preference). For each,
a venv with that ansible-core and the test tools pinned in requirements.txt is made once and kept in
build/matrix/ (a new pin or another Python makes a new one); then pytest runs every test module that
runs Ansible (it imports ansible, tests.ansible_compat or calls tests.tools.ansible_command: the
module tests, the ad hoc numa_facts/numa_plan runs, the role's planning and unit rendering, the
filter docs, the README's commands and playbooks, the built and installed tarball). The rest of the suite
never imports Ansible; the phases of the kinds of tests run it, and the conformance corpus, on the pinned core.

Python stdlib only: phases.py runs it with the interpreter that runs `make test`.
"""

import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
VENVS = REPO / "build" / "matrix"


class Core(NamedTuple):
    name: str
    version: str
    pythons: Sequence[str]  # X.Y this core's controller runs on, preferred first
    why: str


CORES = (
    # Debian 12 and RHEL 9 ship 2.14 (on Python 3.11 and 3.9); Ubuntu 24.04 ships 2.16.
    Core("oldest", "2.14.18", ("3.11", "3.10", "3.9"), "requires_ansible's floor: Debian 12, RHEL 9"),
    # 2.20 and later need Python >= 3.12.
    Core("newest", "2.21.5", ("3.12", "3.13", "3.14"), "the newest ansible-core release"),
)
USES_ANSIBLE = re.compile(r"^\s*(?:from|import) ansible\b|from tests\.ansible_compat |ansible_command\(|"
                          r"\bfrom ansible\.\w", re.MULTILINE)
# cryptography: not a test tool but ansible-core's dependency, pinned so no core of the matrix prints its warnings.
TEST_TOOLS = ("pytest", "hypothesis", "cryptography")
# The folders of tests/ by kind (phases.py runs each as a phase of its own).
KINDS = ("unit", "integration", "docs", "tooling")


class MatrixError(Exception):
    """A matrix entry that cannot run, with the cause and the fix."""


class NoPython(MatrixError):
    """No Python this core runs on is installed: the core is not run (and said so), the others are."""


# --- what runs ------------------------------------------------------------------------------

def ansible_test_files(repo: Path = REPO) -> List[str]:
    """Test modules of every kind (tests/unit, integration, docs, tooling) that run Ansible, by their source, or
    import one that does.

    Not tests/conformance: its one Ansible test reads 28 unpacked dumps with the same module code (~100 s a
    core), where the ad hoc runs of test_facts_plan_modules_processes already show that the core runs the module."""
    sources = {}  # every module of the kinds' folders: a test's helper module may be what runs Ansible
    for kind in KINDS:
        for path in sorted(glob.glob(str(repo / "tests" / kind / "*.py"))):
            with open(path, encoding="utf-8") as handle:
                sources["%s.%s" % (kind, Path(path).stem)] = (os.path.relpath(path, str(repo)), handle.read())
    chosen = {name for name, (_, text) in sources.items() if USES_ANSIBLE.search(text)}
    imports = {name: {"%s.%s" % found for found in re.findall(r"^from tests\.(\w+)\.(\w+) import", text,
                                                              re.MULTILINE)}
               for name, (_, text) in sources.items()}
    grown = True
    while grown:
        more = {name for name, imported in imports.items() if imported & chosen} - chosen
        chosen |= more
        grown = bool(more)
    return sorted(sources[name][0] for name in chosen if name.split(".")[1].startswith("test_"))


def floor(runtime_text: str) -> str:
    """``2.14`` from meta/runtime.yml's ``requires_ansible: ">=2.14.0"``."""
    match = re.search(r"^requires_ansible:\s*[\"']?>=\s*(\d+)\.(\d+)(?:\.\d+)?[\"']?\s*$", runtime_text, re.MULTILINE)
    if not match:
        raise MatrixError("meta/runtime.yml has no requires_ansible of the form \">=X.Y.Z\": write the oldest "
                          "ansible-core the collection supports there")
    return "%s.%s" % match.groups()


def check_floor(runtime_text: str, cores: Sequence[Core] = CORES) -> None:
    """The oldest core tested is the one requires_ansible admits first: else the floor is claimed, not shown."""
    oldest = min(cores, key=lambda core: _numbers(core.version))
    if ".".join(oldest.version.split(".")[:2]) != floor(runtime_text):
        raise MatrixError("meta/runtime.yml requires ansible-core >=%s but the matrix's oldest core is %s: make "
                          "CORES in tests/matrix.py start at the floor, or raise the floor"
                          % (floor(runtime_text), oldest.version))


def _numbers(version: str) -> tuple:
    return tuple(int(part) for part in version.split("."))


def tool_pins(requirements_text: str) -> List[str]:
    """requirements.txt's pins of the test tools, so the matrix tests with what the unit phase does."""
    pins = []
    for tool in TEST_TOOLS:
        match = re.search(r"^(%s==\S+)" % re.escape(tool), requirements_text, re.MULTILINE)
        if not match:
            raise MatrixError("requirements.txt pins no %s: add %s==VERSION" % (tool, tool))
        pins.append(match.group(1))
    return pins


# --- interpreters and venvs -----------------------------------------------------------------

def python_candidates(version: str) -> List[str]:
    """Places a Python X.Y may be: the distribution's (what its ansible-core runs on), PATH (not a pyenv shim,
    which runs only the selected version), pyenv's builds."""
    name = "python" + version
    candidates = ["/usr/bin/" + name]
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if directory and "shims" not in Path(directory).parts:
            candidates.append(os.path.join(directory, name))
    pyenv_root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates.extend(sorted(glob.glob(os.path.join(pyenv_root, "versions", version + ".*", "bin", name)),
                             reverse=True))
    return list(dict.fromkeys(candidates))


def find_python(core: Core) -> str:
    for version in core.pythons:
        for candidate in python_candidates(version):
            if os.access(candidate, os.X_OK) and _runs(candidate):
                return candidate
    raise NoPython("ansible-core %s (%s) needs Python %s, and none is installed: install one (pyenv install %s, "
                   "or the distribution's python%s with its venv module)"
                   % (core.version, core.name, " or ".join(core.pythons), core.pythons[0], core.pythons[0]))


def _runs(python: str) -> bool:
    done = subprocess.run([python, "-c", "import venv, ensurepip"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, check=False)
    return done.returncode == 0


def venv_dir(core: Core, python: str, pins: Sequence[str]) -> Path:
    """Keyed by the exact interpreter and every pin: any change makes a new venv."""
    version = subprocess.run([python, "-c", "import sys; print(sys.version)"], stdout=subprocess.PIPE,
                             universal_newlines=True, check=True).stdout.strip()
    key = hashlib.sha256("\n".join([python, version, "ansible-core==" + core.version] + list(pins))
                         .encode()).hexdigest()[:12]
    return VENVS / ("ansible-core-%s-%s" % (core.version, key))


def ensure_venv(core: Core, python: str, pins: Sequence[str], log) -> Path:
    venv = venv_dir(core, python, pins)
    stamp = venv / ".complete"
    if stamp.is_file():
        say(log, "%s: cached venv %s" % (core.name, os.path.relpath(str(venv), str(REPO))))
        return venv
    shutil.rmtree(str(venv), ignore_errors=True)
    say(log, "%s: making a venv with ansible-core %s on %s (once; about a minute)" % (core.name, core.version, python))
    started = time.monotonic()
    run_checked([python, "-m", "venv", str(venv)], "python -m venv", log)
    run_checked([str(venv / "bin" / "pip"), "install", "-q", "ansible-core==" + core.version] + list(pins),
                "pip install ansible-core==%s" % core.version, log)
    stamp.write_text("ansible-core==%s %s\n" % (core.version, " ".join(pins)))
    say(log, "%s: venv ready in %.0f s" % (core.name, time.monotonic() - started))
    return venv


def run_checked(argv: List[str], what: str, log) -> None:
    if subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL) != 0:
        raise MatrixError("%s failed (output above): check that PyPI is reachable" % what)


def installed_core(venv: Path) -> str:
    done = subprocess.run([str(venv / "bin" / "python"), "-c", "from ansible.release import __version__; "
                           "print(__version__)"], stdout=subprocess.PIPE, universal_newlines=True, check=True)
    return done.stdout.strip()


# --- running ----------------------------------------------------------------------------------

def say(log, text: str) -> None:
    log.write("matrix: %s\n" % text)
    log.flush()


def run_core(core: Core, pins: Sequence[str], tests: Sequence[str], log) -> dict:
    started = time.monotonic()
    row = {"core": core.name, "version": core.version, "python": "-", "result": "not run", "seconds": 0.0}
    try:
        python = find_python(core)
        venv = ensure_venv(core, python, pins, log)
        row["python"] = subprocess.run([str(venv / "bin" / "python"), "-c", "import platform; "
                                        "print(platform.python_version())"], stdout=subprocess.PIPE,
                                       universal_newlines=True, check=True).stdout.strip()
        if installed_core(venv) != core.version:
            raise MatrixError("the venv %s holds ansible-core %s, not %s: delete it" % (venv, installed_core(venv),
                                                                                     core.version))
        say(log, "%s: ansible-core %s on Python %s: pytest %s" % (core.name, core.version, row["python"],
                                                                  " ".join(tests)))
        code = subprocess.call([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs"]
                               + list(tests), cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, env=_environment(venv))
        row["result"] = "ok" if code == 0 else "FAILED (pytest exit %d)" % code
    except NoPython as exc:
        say(log, "%s: NOT RUN: %s" % (core.name, exc))
        # phases.py adds this line to the phase table.
        log.write("phase note: %s core %s not run: no Python %s here\n" % (core.name, core.version,
                                                                          " or ".join(core.pythons)))
        row["result"] = "not run: %s" % exc
    except MatrixError as exc:
        say(log, "%s: %s" % (core.name, exc))
        row["result"] = "FAILED: %s" % exc
    row["seconds"] = time.monotonic() - started
    return row


def _environment(venv: Path) -> dict:
    """The core's venv first on PATH, as an activated venv: the tests find ansible-playbook beside their
    interpreter, and whatever runs a tool by name gets this core's."""
    env = dict(os.environ, VIRTUAL_ENV=str(venv))
    env["PATH"] = os.pathsep.join([str(venv / "bin")] + [part for part in env.get("PATH", "").split(os.pathsep)
                                                        if part and part != str(REPO / ".venv" / "bin")])
    return env


def table(rows: List[dict]) -> str:
    lines = ["%-7s %-13s %-7s %6s  %s" % ("core", "ansible-core", "python", "wall", "result")]
    for row in rows:
        lines.append("%-7s %-13s %-7s %3d:%02d  %s" % ((row["core"], row["version"], row["python"])
                                                      + divmod(int(round(row["seconds"])), 60) + (row["result"],)))
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    names = sys.argv[1:] if argv is None else argv
    unknown = [name for name in names if name not in [core.name for core in CORES]]
    if unknown:
        print("matrix: no core named %s: use %s" % (", ".join(unknown), " or ".join(c.name for c in CORES)),
              file=sys.stderr)
        return 2
    log = sys.stdout
    try:
        check_floor((REPO / "meta" / "runtime.yml").read_text())
        pins = tool_pins((REPO / "requirements.txt").read_text())
    except MatrixError as exc:
        say(log, str(exc))
        return 1
    tests = ansible_test_files()
    rows = [run_core(core, pins, tests, log) for core in CORES if not names or core.name in names]
    text = table(rows)
    print("\n" + text, flush=True)
    (REPO / "build" / "logs").mkdir(parents=True, exist_ok=True)
    (REPO / "build" / "logs" / "matrix.txt").write_text(text + "\n")
    # A core without its Python is not run and said so; every core that ran must pass, and one must run.
    ran = [row for row in rows if not row["result"].startswith("not run")]
    return 0 if ran and all(row["result"] == "ok" for row in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
