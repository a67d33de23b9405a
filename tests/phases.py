#!/usr/bin/env python3
"""`make test`: every check the project has, run as timed phases that keep both cores busy.

    apt ──┬── image ─────────────┐      (background: the lab guest's disk, cached by recipe)
          ├── llama-server ──────┤      (background: compiled once, cached by recipe)
          └── venv ──────────────┴── molecule            (foreground: the lab, the longest phase)
                 ├── molecule-container                  (background, niced: the container scenario, minutes)
                 └── unit ── docs ── tooling ── integration ── lint ── sanity ── matrix
                                                 (background, niced, one after another: they fill the spare core)

The molecule lab is a chain of steps that each wait on the emulated guest, so it sets the pace; it
starts as soon as the guest image and llama-server are there, and the Python checks run beside the
builds and the lab at a lower priority, so they never slow it down. The pytest phases are the kinds of
tests, each a folder of tests/: unit (pure: no subprocess, no Ansible run, no network; `make unit` runs it
alone), docs (the README and docs/), tooling (the project's own: matrix, phases, the lab VM, the collection
build, the execution environment, the import layers), integration (ansible-playbook, modules and numa-pin
run as processes, systemd-analyze, promtool, compilers; with tests/conformance, the captured machines).
matrix (tests/matrix.py) runs the tests that run Ansible on the oldest and the newest ansible-core the
collection supports.

Every pytest phase runs its tests in a shuffled order (modules, and the tests in each: tests/conftest.py's
--shuffle), one seed for the whole run, printed first and in the summary: `INFEROPS_NUMA_SHUFFLE=SEED make
test` replays it. The phases set INFEROPS_NUMA_REQUIRE_TOOLS=1: a tool this run installs (the apt packages, the
venv's commands) that is missing fails its test instead of skipping it (tests/tools.py); the captured machines of
../shared, which no run installs, skip cleanly when absent; the table counts each phase's skips from pytest's
summary line.

Each phase writes build/logs/<phase>.log; foreground phases also print to the console. A failed
phase does not stop the phases that do not need it, so one run reports every failure. The run
ends with a table of the phases and their wall times (also in build/logs/phases.txt) and, for a
failure, the failing checks and the log to read. While the console has been quiet for HEARTBEAT_SECONDS
(a background build, a silent lab step), it says which phases run and the last line of each one's log.

Python stdlib only: it runs before the venv exists.
"""

import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
LOGS = REPO / "build" / "logs"
LAB_CHECKS = REPO / "build" / "reports" / "lab-checks.txt"  # molecule/default/tests/conftest.py writes it
VENV_BIN = REPO / ".venv" / "bin"
# The Python checks yield the CPU to the builds and the lab's emulated guest, which set the pace.
CHECKS_NICENESS = 10
LOG_COLUMNS = 200
HEARTBEAT_SECONDS = 10.0
HEARTBEAT_LINE = 110
# The folders of tests/ each pytest phase runs, in the order they run (tests/matrix.py's KINDS).
PYTEST_PHASES = (("unit", ("tests/unit",)), ("docs", ("tests/docs",)), ("tooling", ("tests/tooling",)),
                 ("integration", ("tests/integration", "tests/conformance")))
SHUFFLE_ENV = "INFEROPS_NUMA_SHUFFLE"
REQUIRE_TOOLS_ENV = "INFEROPS_NUMA_REQUIRE_TOOLS"


class Phase:
    """A command; it starts once its needs succeeded and the phases it comes after ended."""

    def __init__(self, name: str, argv: Sequence[str], needs: Sequence[str] = (),
                 background: bool = False, after: Sequence[str] = (), nice: int = 0):
        self.name, self.needs, self.background = name, list(needs), background
        self.after = list(after)
        self.argv = (["nice", "-n", str(nice)] if nice else []) + list(argv)
        self.started: Optional[float] = None
        self.ended: Optional[float] = None
        self.status = "not run"
        self.skipped: Optional[int] = None  # tests pytest skipped, from its summary line (None: no pytest there)
        self.log = LOGS / ("%s.log" % name)

    @property
    def seconds(self) -> float:
        if self.started is None:
            return 0.0
        return (self.ended or time.monotonic()) - self.started


def shuffle_seed(environ: Dict[str, str]) -> int:
    """The seed of this run's test order: $INFEROPS_NUMA_SHUFFLE to replay one, else a new one."""
    given = environ.get(SHUFFLE_ENV, "").strip()
    if given:
        try:
            return int(given)
        except ValueError:
            raise SystemExit("%s=%r: give the integer seed a run printed" % (SHUFFLE_ENV, given))
    return random.SystemRandom().randrange(1, 10 ** 6)


def phases(seed: int = 0) -> List[Phase]:
    make = ["make", "--no-print-directory"]
    pytest = [str(VENV_BIN / "pytest"), "-q", "-p", "no:cacheprovider", "--shuffle=%d" % seed]
    checks: List[Phase] = []
    for name, folders in PYTEST_PHASES:
        checks.append(Phase(name, pytest + list(folders), ["venv"], background=True,
                            after=[checks[-1].name] if checks else [], nice=CHECKS_NICENESS))
    return [
        Phase("apt", make + ["apt"]),
        Phase("image", [sys.executable, "lab/labvm.py", "image"], ["apt"], background=True),
        Phase("llama-server", ["bash", "lab/llama/build_server.sh"], ["apt"], background=True),
        Phase("venv", make + ["lab-venv"], ["apt"]),
    ] + checks + [
        Phase("lint", [str(VENV_BIN / "ansible-lint"), "--profile", "production"], ["venv"],
              background=True, after=[checks[-1].name], nice=CHECKS_NICENESS),
        Phase("sanity", ["tests/sanity.sh"], ["venv"], background=True, after=["lint"], nice=CHECKS_NICENESS),
        Phase("matrix", [sys.executable, "tests/matrix.py"], ["venv"], background=True, after=["sanity"],
              nice=CHECKS_NICENESS),
        # The fast container scenario (lab/container.py: its image made in the phase, cached by recipe), beside the
        # lab: minutes of niced work (the container's processes inherit the niceness) on the spare core.
        Phase("molecule-container", [str(VENV_BIN / "molecule"), "test", "-s", "container"], ["venv"],
              background=True, nice=CHECKS_NICENESS),
        Phase("molecule", [str(VENV_BIN / "molecule"), "test"], ["venv", "image", "llama-server"]),
    ]


# --------------------------------------------------------------------- running ---

def phase_environment(base: Dict[str, str]) -> Dict[str, str]:
    """The venv's tools first on PATH: molecule runs `pytest` by name, and a pyenv or distro pytest
    ahead of it (pyenv's exec puts its own bin first) lacks the testinfra plugin."""
    env = dict(base)
    env["PATH"] = os.pathsep.join([str(VENV_BIN)] + [part for part in env.get("PATH", "").split(os.pathsep)
                                                    if part and part != str(VENV_BIN)])
    env["VIRTUAL_ENV"] = str(VENV_BIN.parent)
    # Every tool and fixture the tests use is installed by now: a missing one fails its test (tests/tools.py).
    env[REQUIRE_TOOLS_ENV] = "1"
    # molecule boxes and wraps its tools' output at the console width, 80 on a pipe: a failing test's
    # id would be cut over several lines of the log.
    env.setdefault("COLUMNS", str(LOG_COLUMNS))
    return env


class Console:
    """The terminal the phases share: one writer at a time, and when it last printed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last = time.monotonic()

    def say(self, text: str) -> None:
        with self.lock:
            print(text, flush=True)
            self.last = time.monotonic()

    def write(self, raw: bytes) -> None:
        with self.lock:
            sys.stdout.buffer.write(raw)
            sys.stdout.flush()
            self.last = time.monotonic()


def run(phase: Phase, console: Console) -> None:
    phase.started = time.monotonic()
    LOGS.mkdir(parents=True, exist_ok=True)
    banner = "== %s: %s" % (phase.name, " ".join(phase.argv))
    with open(str(phase.log), "w") as log:
        log.write(banner + "\n")
        log.flush()
        if phase.background:
            console.say("%s (background, log: %s)" % (banner, _rel(phase.log)))
            code = subprocess.call(phase.argv, cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=phase_environment(dict(os.environ)))
        else:
            console.say(banner)
            code = _tee(phase.argv, log, console)
    phase.ended = time.monotonic()
    phase.status = "ok" if code == 0 else "FAILED (exit %d)" % code
    text = phase.log.read_text(errors="replace")
    phase.status += "".join("; %s" % note for note in phase_notes(text))
    phase.skipped = pytest_skips(text)
    skips = "" if phase.skipped is None else ", %d skipped" % phase.skipped
    console.say("== %s: %s after %s%s" % (phase.name, phase.status, clock(phase.seconds), skips))


def _tee(argv: List[str], log, console: Console) -> int:
    proc = subprocess.Popen(argv, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=phase_environment(dict(os.environ)))
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        console.write(raw)
        log.write(raw.decode(errors="replace"))
        log.flush()
    log.flush()
    return proc.wait()


def heartbeat(all_phases: List[Phase], origin: float) -> str:
    """One line: the run's clock, then each running phase with its time and the last line of its log."""
    parts = ["%s %s: %s" % (phase.name, clock(phase.seconds), last_line(phase.log) or "(no output yet)")
             for phase in all_phases if phase.status == "running"]
    return "... %s: %s" % (clock(time.monotonic() - origin), "; ".join(parts))


def last_line(path: Path) -> str:
    """The log's last non-empty line, without terminal codes or molecule's box, cut to HEARTBEAT_LINE."""
    try:
        with open(str(path), "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 4096))
            tail = handle.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [_TERMINAL_CODES.sub("", line).strip(" \u2502\u2500\t\r") for line in tail.splitlines()]
    lines = [line for line in lines if line]
    text = lines[-1] if lines else ""
    return text if len(text) <= HEARTBEAT_LINE else text[:HEARTBEAT_LINE - 3] + "..."


def schedule(all_phases: List[Phase], heartbeat_seconds: float = HEARTBEAT_SECONDS) -> None:
    """Background phases start as soon as their needs are met; foreground ones run one at a time."""
    by_name = {phase.name: phase for phase in all_phases}
    console = Console()
    origin = time.monotonic()
    threads: Dict[str, threading.Thread] = {}

    def ready(phase: Phase) -> Optional[bool]:
        """True to run, False when a need failed, None while one is pending."""
        if any(by_name[name].status in ("not run", "running") for name in phase.after):
            return None
        for need in phase.needs:
            status = by_name[need].status
            if status == "not run" or status == "running":
                return None
            if status != "ok":
                return False
        return True

    def launch(phase: Phase) -> None:
        phase.status = "running"
        thread = threading.Thread(target=run, args=(phase, console), daemon=True)
        threads[phase.name] = thread
        thread.start()

    pending = list(all_phases)
    while pending or any(thread.is_alive() for thread in threads.values()):
        foreground_busy = any(p.status == "running" and not p.background for p in all_phases)
        for phase in list(pending):
            verdict = ready(phase)
            if verdict is False:
                failed = [need for need in phase.needs if by_name[need].status != "ok"]
                phase.status = "skipped (needs %s)" % ", ".join(failed)
                pending.remove(phase)
            elif verdict and (phase.background or not foreground_busy):
                launch(phase)
                pending.remove(phase)
                foreground_busy = foreground_busy or not phase.background
        if time.monotonic() - console.last >= heartbeat_seconds and any(p.status == "running" for p in all_phases):
            console.say(heartbeat(all_phases, origin))
        time.sleep(0.2)
    for thread in threads.values():
        thread.join()


# --------------------------------------------------------------------- reporting ---

def clock(seconds: float) -> str:
    return "%d:%02d" % divmod(int(round(seconds)), 60)


def _rel(path: Path) -> str:
    return os.path.relpath(str(path), str(REPO))


def table(all_phases: List[Phase], origin: float) -> str:
    rows = [("phase", "started", "wall", "skipped", "result")]
    for phase in all_phases:
        began = "-" if phase.started is None else clock(phase.started - origin)
        wall = "-" if phase.started is None else clock(phase.seconds)
        skipped = "-" if phase.skipped is None else str(phase.skipped)
        note = phase.status + (" (background)" if phase.background and phase.started else "")
        rows.append((phase.name, began, wall, skipped, note))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join([row[0].ljust(widths[0]), row[1].rjust(widths[1]), row[2].rjust(widths[2]),
                        row[3].rjust(widths[3]), row[4]])
             for row in rows]
    return "\n".join(lines)


# pytest's closing line, -q or not: "1491 passed, 27 skipped in 366.43s (0:06:06)", "=== 3 failed in 1.2s ===".
_PYTEST_SUMMARY = re.compile(r"^[=\s]*((?:\d+ [a-z]+)(?:, \d+ [a-z]+)*|no tests ran) in \d+(?:\.\d+)?s\b")


_PHASE_NOTE = re.compile(r"^phase note: (.+)$", re.MULTILINE)


def phase_notes(log_text: str) -> List[str]:
    """What a phase's own tool asked the table to say (the matrix: a core it did not run, and why)."""
    return _PHASE_NOTE.findall(log_text)


def pytest_skips(log_text: str) -> Optional[int]:
    """The tests skipped in a log's pytest runs (the matrix has one per core); None when pytest did not finish."""
    counts = []
    for line in _unwrapped(_TERMINAL_CODES.sub("", log_text).splitlines()):
        match = _PYTEST_SUMMARY.match(line)
        if match:
            found = re.search(r"(\d+) skipped", match.group(1))
            counts.append(int(found.group(1)) if found else 0)
    return sum(counts) if counts else None


# pytest's short summary, Ansible's failed tasks, ansible-lint's and ansible-test's findings.
_PYTEST_FAILURE = re.compile(r"^(?:FAILED|ERROR) (\S+)")
_TASK = re.compile(r"^TASK \[(.*)\]")
_ANSIBLE_FAILURE = re.compile(r"^(?:fatal|failed): \[([^\]]+)\]")
_LINT_RULE = re.compile(r"^([\w-]+\[[\w-]+\]|[\w-]+): \S")
_LINT_PLACE = re.compile(r"^(\S+/\S+:\d+(?::\d+)?)\s*$")
_SANITY_ERROR = re.compile(r"^ERROR: (.+)")
# Colours and terminal hyperlinks (ansible-lint, molecule) around the words that matter.
_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;]*m|\x1b\]8;;[^\x1b]*\x1b\\")


def _unwrapped(lines: List[str]) -> List[str]:
    """Lines without molecule's box; a line it wrapped ("FAILED", then the test id over two lines,
    each continuation indented) joined again."""
    joined: List[str] = []
    for raw in lines:
        line = raw.strip(" \u2502").rstrip()
        continues = raw.lstrip(" ").startswith("\u2502   ") and joined and joined[-1]
        if continues and (joined[-1] in ("FAILED", "ERROR") or joined[-1].count("[") > joined[-1].count("]")):
            joined[-1] += (" " if joined[-1] in ("FAILED", "ERROR") else "") + line
        else:
            joined.append(line)
    return joined


def failing_checks(log_text: str, limit: int = 10) -> List[str]:
    """The checks a failed phase's log names, most specific first; the last line as a fallback."""
    found: List[str] = []
    task = rule = None
    for line in _unwrapped(_TERMINAL_CODES.sub("", log_text).splitlines()):
        match = _TASK.match(line)
        if match:
            task = match.group(1)
            continue
        match = _PYTEST_FAILURE.match(line)
        if match:
            found.append("test %s" % match.group(1))
            continue
        match = _ANSIBLE_FAILURE.match(line)
        if match:
            found.append("task '%s' on %s" % (task or "?", match.group(1)))
            continue
        match = _SANITY_ERROR.match(line)
        if match:
            found.append(match.group(1))
            continue
        match = _LINT_PLACE.match(line)
        if match and rule:
            found.append("%s %s" % (rule, match.group(1)))
        match = _LINT_RULE.match(line)
        rule = match.group(1) if match else None
    unique = list(dict.fromkeys(found))
    if unique:
        return unique[:limit]
    tail = [line for line in log_text.splitlines() if line.strip()]
    return [tail[-1].strip()] if tail else ["(empty log)"]


def lab_budgets(since: float, lines: int = 6) -> str:
    """The head of this run's lab budget report (molecule/default/tests/conftest.py writes it): the total, and
    the checks nearest their budgets; empty when the lab did not get that far in this run."""
    try:
        if LAB_CHECKS.stat().st_mtime < since:
            return ""
        head = LAB_CHECKS.read_text(errors="replace").splitlines()[:lines + 2]
    except OSError:
        return ""
    return "\n".join(head + ["(all of them: %s)" % _rel(LAB_CHECKS)]) + "\n"


def report(all_phases: List[Phase], origin: float, seed: Optional[int] = None) -> int:
    total = time.monotonic() - origin
    text = table(all_phases, origin)
    failed = [phase for phase in all_phases if phase.status != "ok"]
    summary = "make test: %s in all, %s" % (
        clock(total), "every phase ok" if not failed else "%d phase(s) not ok" % len(failed))
    if seed is not None:
        summary += "; tests shuffled with seed %d (replay: %s=%d make test)" % (seed, SHUFFLE_ENV, seed)
    budgets = lab_budgets(time.time() - total)
    LOGS.mkdir(parents=True, exist_ok=True)
    (LOGS / "phases.txt").write_text(text + "\n" + summary + "\n" + budgets)
    print("\n" + text + "\n" + summary + ("\n" + budgets if budgets else ""))
    for phase in failed:
        if phase.status.startswith("FAILED"):
            checks = failing_checks(phase.log.read_text(errors="replace"))
            print("\n%s failed; log: %s" % (phase.name, _rel(phase.log)))
            for check in checks:
                print("  - %s" % check)
    return 1 if failed else 0


def main() -> int:
    origin = time.monotonic()
    seed = shuffle_seed(dict(os.environ))
    print("== tests shuffled with seed %d (replay: %s=%d make test)" % (seed, SHUFFLE_ENV, seed), flush=True)
    os.environ[SHUFFLE_ENV] = str(seed)  # the matrix's pytest runs take the same order
    all_phases = phases(seed)
    try:
        schedule(all_phases)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
    return report(all_phases, origin, seed)


if __name__ == "__main__":
    sys.exit(main())
