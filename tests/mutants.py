"""Targeted mutants of the collection's decisions: does a test fail when a rule is inverted or off by one?

Each mutant is one exact source snippet of one file replaced by a wrong version of it (``>=`` made ``>`` at the
audit's threshold, ``min`` made ``max`` in the planner's node choice, the gate's comparison turned around, an
escaping call removed from a report...), and the fast unit test files that should catch it. The script copies
the working tree once into a temporary directory (without .git, .venv, build and caches: the working tree is
never touched), and for each mutant writes the mutated file into the copy, runs

    python -m pytest -x -q -p no:cacheprovider <its test files>

there, and puts the file back. A mutant is *killed* when the tests fail, and *SURVIVED* when they pass: then no
test can tell the wrong rule from the right one. Bytecode is never written (PYTHONDONTWRITEBYTECODE), so a
mutant of the same size as the original is never run from a stale cache.

Every snippet must occur exactly once in its file: when the code changes, the script says which snippet is gone
(or ambiguous) and fails, rather than silently testing nothing.

Run it from the repository's root, with the interpreter of the test venv:

    .venv/bin/python tests/mutants.py            # every mutant
    .venv/bin/python tests/mutants.py -k audit   # the mutants whose id contains "audit"
    .venv/bin/python tests/mutants.py --list     # the mutants, without running them

Exit status: 0 when every mutant was killed, 1 when one survived or a snippet was not found exactly once.
It is not collected by pytest (its name is not test_*); it takes a few minutes (one pytest per mutant).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, NamedTuple, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MU = "plugins/module_utils/numa/"
PU = "plugins/plugin_utils/"
IGNORED = shutil.ignore_patterns(".git", ".venv", "build", "__pycache__", ".pytest_cache", ".hypothesis",
                                 ".mypy_cache", ".tox", "*.pyc")
PER_MUTANT_SECONDS = 300

# Not test_placement_properties.py: its Hypothesis searches take a minute and more; the rules are pinned by
# exact examples in these two.
PLACEMENT_TESTS = ("tests/unit/test_placement.py", "tests/unit/test_placement_tiers.py")
AUDIT_TESTS = ("tests/unit/test_audit.py", "tests/unit/test_judging.py")
GATE_TESTS = ("tests/unit/test_ab_gate.py",)
WEIGHTS_TESTS = ("tests/unit/test_weights.py",)
PREFLIGHT_TESTS = ("tests/unit/test_preflight.py",)
REPORT_TESTS = ("tests/unit/test_fleet_report.py", "tests/unit/test_cost_report.py")


class Mutant(NamedTuple):
    id: str
    path: str  # relative to the repository
    snippet: str  # exact text, found exactly once
    replacement: str
    description: str
    tests: Sequence[str]


MUTANTS = [
    # --- the planner: node choice, fit and spill (decide/placement.py) ---------------------------------------
    Mutant("placement-score-inverted", MU + "decide/placement.py",
           "return score[0] * other[1] > other[0] * score[1]", "return score[0] * other[1] < other[0] * score[1]",
           "the anchor is the node with the lowest memory score, not the highest", PLACEMENT_TESTS),
    Mutant("placement-score-tie", MU + "decide/placement.py",
           "return score[0] * other[1] > other[0] * score[1]", "return score[0] * other[1] >= other[0] * score[1]",
           "a tie in the memory score goes to the higher node id, not the lowest", PLACEMENT_TESTS),
    Mutant("placement-score-weights", MU + "decide/placement.py",
           "return MEMORY_FIFTHS * free * spread + SPREAD_FIFTHS * total, 5 * total * spread",
           "return SPREAD_FIFTHS * free * spread + MEMORY_FIFTHS * total, 5 * total * spread",
           "the score weighs free memory 2/5 and the spread 3/5 (swapped)", PLACEMENT_TESTS),
    Mutant("placement-anchor-fit-boundary", MU + "decide/placement.py",
           "if _free(hints, state, _scope_nodes(hints, request, node)) >= required]",
           "if _free(hints, state, _scope_nodes(hints, request, node)) > required]",
           "a node whose free memory is exactly the model's need is not counted as one it fits", PLACEMENT_TESTS),
    Mutant("placement-fitting-pool-ignored", MU + "decide/placement.py",
           "pool = fitting or pool", "pool = pool or fitting",
           "the anchor is scored among all nodes, not only those where the model fits", PLACEMENT_TESTS),
    Mutant("placement-minimal-fit-boundary", MU + "decide/placement.py",
           "if _free(hints, state, order[:length]) >= required:", "if _free(hints, state, order[:length]) > required:",
           "a model of exactly the nodes' free memory does not fit them (spills one node further)", PLACEMENT_TESTS),
    Mutant("placement-minimal-fit-last-node", MU + "decide/placement.py",
           "for length in range(len(base), len(order) + 1):", "for length in range(len(base), len(order)):",
           "the spill never reaches the last usable node (off by one)", PLACEMENT_TESTS),
    Mutant("placement-spill-farthest-first", MU + "decide/placement.py",
           "return sorted(nodes, key=lambda node: (node != anchor, self.distance(anchor, node), node))",
           "return sorted(nodes, key=lambda node: (node != anchor, -self.distance(anchor, node), node))",
           "nodes are ordered farthest first by SLIT, not nearest first", PLACEMENT_TESTS),
    Mutant("placement-gpu-anchor-fewest", MU + "decide/placement.py",
           "best = min(local, key=lambda node: (-len(local[node]), node))",
           "best = max(local, key=lambda node: (-len(local[node]), node))",
           "a multi-GPU instance is anchored on the node with the fewest of its GPUs", PLACEMENT_TESTS),
    Mutant("placement-preferred-fit-boundary", MU + "decide/placement.py",
           "elif free >= required:", "elif free > required:",
           "preferred: a model of exactly the node's free memory is said not to fit", PLACEMENT_TESTS),
    Mutant("placement-take-adds", MU + "decide/placement.py",
           "self.free[node] = max(0, self.free[node] - share)", "self.free[node] = max(0, self.free[node])",
           "an instance placed before takes no memory from the next ones' nodes", PLACEMENT_TESTS),
    Mutant("placement-weighted-when-equal", MU + "decide/placement.py",
           "elif len(memory) > 1 and len(set(known.values())) > 1:",
           "elif len(memory) > 1 and len(set(known.values())) >= 1:",
           "auto interleave is weighted even where the kernel's weights are all equal", PLACEMENT_TESTS),
    Mutant("placement-instances-cpus-boundary", MU + "decide/placement.py",
           "if request.instances > usable:", "if request.instances >= usable:",
           "as many instances as usable CPUs are refused (one CPU each is enough)", PLACEMENT_TESTS),

    # --- the audit's threshold (read/audit.py, inputs/judging.py) -------------------------------------------
    Mutant("audit-threshold-strict", MU + "read/audit.py",
           "if local >= min_local_percent:", "if local > min_local_percent:",
           "a local share exactly at min_local_percent fails instead of passing", AUDIT_TESTS),
    Mutant("audit-threshold-inverted", MU + "read/audit.py",
           "if local >= min_local_percent:", "if local <= min_local_percent:",
           "a local share above min_local_percent fails, below passes", AUDIT_TESTS),
    Mutant("audit-share-rounding", MU + "read/audit.py",
           "return round(100.0 * part / whole, 2)", "return round(100.0 * part / whole, 1)",
           "the local share is rounded to 0.1 (98.96 % passes at 99)", AUDIT_TESTS),
    Mutant("audit-pages-all-anon-only", MU + "read/audit.py",
           'return entry["anon"] + entry["file"]', 'return entry["anon"]',
           "pages=all counts only anon memory", AUDIT_TESTS),
    Mutant("audit-enforced-policies", MU + "inputs/judging.py",
           'ENFORCED_POLICIES = ("bind",)', 'ENFORCED_POLICIES = ("bind", "preferred")',
           "a preferred plan's local share is enforced too", AUDIT_TESTS),
    Mutant("audit-weight-band-boundary", MU + "read/audit.py",
           "> WEIGHT_BAND_PERCENT]", ">= WEIGHT_BAND_PERCENT]",
           "a weighted split exactly at the band's edge is a problem", AUDIT_TESTS),
    Mutant("audit-thread-last-cpu", MU + "read/audit.py",
           'return thread["last_cpu"] is not None and thread["last_cpu"] not in cpus', "return False",
           "a thread last seen on a CPU outside the plan passes", AUDIT_TESTS),
    Mutant("audit-thread-allowed-reversed", MU + "read/audit.py",
           "if allowed - set(cpus):", "if set(cpus) - allowed:",
           "a thread allowed more CPUs than the plan's passes; one allowed fewer fails", AUDIT_TESTS),
    Mutant("judging-hundred-refused", MU + "inputs/judging.py",
           "not 0 <= min_local_percent <= 100", "not 0 <= min_local_percent < 100",
           "min_local_percent 100 is refused", AUDIT_TESTS),
    Mutant("judging-zero-refused", MU + "inputs/judging.py",
           "not 0 <= min_local_percent <= 100", "not 0 < min_local_percent <= 100",
           "min_local_percent 0 is refused", AUDIT_TESTS),

    # --- the A/B gate's keep / rollback (measure/ab_gate.py) ----------------------------------------------------
    Mutant("gate-min-gain-strict", MU + "measure/ab_gate.py",
           "kept = gain >= min_gain_percent if", "kept = gain > min_gain_percent if",
           "a gain exactly min_gain_percent is rolled back instead of kept", GATE_TESTS),
    Mutant("gate-band-strict", MU + "measure/ab_gate.py",
           "else gain >= -band", "else gain > -band",
           "a loss exactly the noise band is rolled back instead of kept", GATE_TESTS),
    Mutant("gate-band-sign", MU + "measure/ab_gate.py",
           "else gain >= -band", "else gain >= band",
           "without min_gain_percent, a change must gain the band instead of losing no more than it", GATE_TESTS),
    Mutant("gate-gain-over-new", MU + "measure/ab_gate.py",
           "gain = 100.0 * (new - old) / old", "gain = 100.0 * (new - old) / new",
           "the gain is in percent of the rate after, not before", GATE_TESTS),
    Mutant("gate-floor-min", MU + "measure/ab_gate.py",
           "floored = max(FLOOR_PERCENT, band_percent(before, after))",
           "floored = min(FLOOR_PERCENT, band_percent(before, after))",
           "the floor caps the band instead of raising it", GATE_TESTS),
    Mutant("gate-cap-max", MU + "measure/ab_gate.py",
           "return min(floored, max_noise_percent), floored > max_noise_percent",
           "return max(floored, max_noise_percent), floored > max_noise_percent",
           "max_noise_percent raises the band instead of capping it", GATE_TESTS),
    Mutant("gate-more-rounds-boundary", MU + "measure/ab_gate.py",
           "while len(rates) < max_rounds and", "while len(rates) <= max_rounds and",
           "a noisy set is measured to one round past max_rounds", GATE_TESTS),
    Mutant("gate-problems-low-bound", MU + "inputs/gate.py",
           "if not finite_number(value) or not low <= value <= high:",
           "if not finite_number(value) or not low < value <= high:",
           "an ab_gate value exactly at its lowest bound is refused", GATE_TESTS),
    Mutant("gate-max-rounds-equal", MU + "inputs/gate.py",
           "most is not None and most < rounds:", "most is not None and most <= rounds:",
           "max_rounds equal to rounds is refused", GATE_TESTS),

    # --- the weighted-interleave weights (decide/weights.py) ------------------------------------------------
    Mutant("weights-truncated", MU + "decide/weights.py",
           "max(1, int(round(STEPS * bandwidth / fastest)))", "max(1, int(STEPS * bandwidth / fastest))",
           "a weight is truncated to tenths instead of rounded", WEIGHTS_TESTS),
    Mutant("weights-floor-zero", MU + "decide/weights.py",
           "max(1, int(round(STEPS * bandwidth / fastest)))", "max(0, int(round(STEPS * bandwidth / fastest)))",
           "a very slow node gets weight 0 (the kernel's minimum is 1)", WEIGHTS_TESTS),
    Mutant("weights-slowest-reference", MU + "decide/weights.py",
           "fastest = max(by_node.values(), default=0)", "fastest = min(by_node.values(), default=0)",
           "weights are in tenths of the slowest node's bandwidth", WEIGHTS_TESTS),
    Mutant("weights-measured-worst", MU + "decide/weights.py",
           "best[node] = max(cells)", "best[node] = min(cells)",
           "a memory node's measured figure is its worst CPU node's, not its best", WEIGHTS_TESTS),
    Mutant("weights-hmat-higher", MU + "decide/weights.py",
           "by_node[node[\"id\"]] = min(known)", "by_node[node[\"id\"]] = max(known)",
           "HMAT: the higher of read and write bandwidth, not the lower", WEIGHTS_TESTS),
    Mutant("weights-bandwidth-bound", MU + "decide/weights.py",
           "return finite_number(value) and 0 < value <= highest",
           "return finite_number(value) and 0 < value < highest",
           "a bandwidth exactly at the bound is refused", WEIGHTS_TESTS),

    # --- the preflight's refusals (read/preflight.py, plugin_utils/preflight.py, inputs/gate.py) -------------
    Mutant("preflight-systemd-or", MU + "read/preflight.py",
           'if comm == "systemd" and booted:', 'if comm == "systemd" or booted:',
           "a host with /run/systemd/system but another PID 1 passes", PREFLIGHT_TESTS),
    Mutant("preflight-capability-bit", MU + "read/preflight.py",
           "return bool(int(mask, 16) >> bit & 1)", "return bool(int(mask, 16) >> (bit - 1) & 1)",
           "the capability is read one bit off (CAP_SYS_PTRACE's neighbour)", PREFLIGHT_TESTS),
    Mutant("preflight-capability-non-root", MU + "read/preflight.py",
           "(os.geteuid() if euid is None else euid) != 0", "(os.geteuid() if euid is None else euid) == 0",
           "the CAP_SYS_PTRACE problem is told to non-root runs and never to root", PREFLIGHT_TESTS),
    Mutant("preflight-slice-reversed", MU + "read/preflight.py",
           'cpus = set(parse_cpulist(row["cpulist"])) - set(allowed["cpus"])',
           'cpus = set(allowed["cpus"]) - set(parse_cpulist(row["cpulist"]))',
           "the slice's CPUs outside the plan are named, not the plan's outside the slice", PREFLIGHT_TESTS),
    Mutant("preflight-executable-readable", MU + "read/preflight.py",
           "return os.path.isfile(path) and os.access(path, os.X_OK)",
           "return os.path.isfile(path) and os.access(path, os.R_OK)",
           "a readable but not executable server binary passes", PREFLIGHT_TESTS),
    Mutant("preflight-mempolicy-errno", MU + "read/preflight.py",
           "if exc.errno in (errno.EPERM, errno.ENOSYS, errno.EACCES):",
           "if exc.errno not in (errno.EPERM, errno.ENOSYS, errno.EACCES):",
           "set_mempolicy refused by seccomp passes; any other error is told as a refusal", PREFLIGHT_TESTS),
    Mutant("preflight-range-low-strict", PU + "preflight.py",
           "(low is None or low <= converted)", "(low is None or low < converted)",
           "a value exactly at its lowest bound (port_base 1, min_local_percent 0) is refused", PREFLIGHT_TESTS),
    Mutant("preflight-range-high-strict", PU + "preflight.py",
           "(high is None or converted <= high)", "(high is None or converted < high)",
           "a value exactly at its highest bound (port_base 65535, min_local_percent 100) is refused",
           PREFLIGHT_TESTS),
    Mutant("preflight-duplicate-names", PU + "preflight.py",
           "for name in sorted(set(names)) if names.count(name) > 1]",
           "for name in sorted(set(names)) if names.count(name) > 2]",
           "a name given to two entries passes (only three are refused)", PREFLIGHT_TESTS),
    Mutant("preflight-port-zero", PU + "preflight.py",
           "if port == 0:", "if port == 1:",
           "a health URL on port 0 passes", PREFLIGHT_TESTS),
    Mutant("preflight-close-cutoff", PU + "preflight.py",
           "close = difflib.get_close_matches(name, options, n=1, cutoff=CLOSE_CUTOFF)",
           "close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)",
           "a play variable merely alike an option is taken for its typo", PREFLIGHT_TESTS),

    # --- the reports' escaping (plugin_utils/*report*, host_results, watch/fleet.py) -------------------------
    Mutant("report-html-autoescape", PU + "report_pages.py",
           "loader=FileSystemLoader(TEMPLATES), autoescape=True,",
           "loader=FileSystemLoader(TEMPLATES), autoescape=False,",
           "the HTML page prints hosts' text unescaped", REPORT_TESTS),
    Mutant("report-html-one-line", PU + "report_pages.py",
           "else one_line(value)", "else value",
           "an HTML value keeps its line breaks and control characters", REPORT_TESTS),
    Mutant("report-md-one-line", PU + "report_pages.py",
           "text = one_line(str(value))", "text = str(value)",
           "a Markdown value keeps its line breaks (a new heading or row)", REPORT_TESTS),
    Mutant("report-md-pipe", PU + "report_pages.py",
           'text.replace("|", "\\\\|")', "text",
           "a | in a Markdown code span is left to open a table cell", REPORT_TESTS),
    Mutant("report-md-dot", PU + "report_pages.py",
           r"|(?<=[0-9])\.(?=[0-9]))*)?$", r"|\.)*)?$",
           "a dot anywhere is plain Markdown (www.example.org becomes a link)", REPORT_TESTS),
    Mutant("report-md-fence", PU + "report_pages.py",
           'fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)',
           'fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 0)',
           "a code span's fence is no longer than the backticks inside it", REPORT_TESTS),
    Mutant("report-md-pad", PU + "report_pages.py",
           'pad = " " if text.startswith("`") or text.endswith("`") else ""', 'pad = ""',
           "a backtick at a value's edge joins the fence", REPORT_TESTS),
    Mutant("report-one-line-join", PU + "host_results.py",
           'return " ".join(shown.split()) + ("..." if len(text) > limit else "")',
           'return shown + ("..." if len(text) > limit else "")',
           "one_line keeps runs of spaces, tabs and line breaks", REPORT_TESTS),
    Mutant("report-escaped-controls", PU + "host_results.py",
           'elif unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co", "Cn"):',
           'elif unicodedata.category(char) in ("Cc", "Cs", "Co", "Cn"):',
           "a format character (bidi override, zero-width) is printed as it is", REPORT_TESTS),
    Mutant("report-balancing-on", PU + "fleet_report.py",
           '"balancing_on": balancing in (1, 3)', '"balancing_on": balancing in (1, 2)',
           "memory tiering alone (2) counts as balancing on, and 3 does not", REPORT_TESTS),
    Mutant("fleet-gpus-without-node", MU + "watch/fleet.py",
           'if gpu.get("numa_node") is None]', 'if gpu.get("numa_node") is not None]',
           "the topology summary lists the GPUs with a node as those without", REPORT_TESTS),
    Mutant("fleet-memory-bytes", MU + "watch/fleet.py",
           '"memory_total_bytes": (node.get("memory_total_kb") or 0) * 1024',
           '"memory_total_bytes": (node.get("memory_total_kb") or 0) * 1000',
           "a node's memory is counted in kB of 1000 bytes", REPORT_TESTS),
]


def check_snippets(root: str, mutants: Sequence[Mutant]) -> List[str]:
    """A line for each mutant whose snippet does not occur exactly once in its file (or whose file is gone)."""
    problems = []
    for mutant in mutants:
        path = os.path.join(root, mutant.path)
        if not os.path.isfile(path):
            problems.append("%s: %s is gone" % (mutant.id, mutant.path))
            continue
        with open(path, encoding="utf-8") as handle:
            count = handle.read().count(mutant.snippet)
        if count != 1:
            problems.append("%s: the snippet occurs %d times in %s, not once: %r" % (
                mutant.id, count, mutant.path, mutant.snippet))
    return problems


def run_mutant(copy: str, mutant: Mutant, python: str) -> bool:
    """Whether the mutant's tests fail on the copy with the mutant written in (the file is restored after)."""
    path = os.path.join(copy, mutant.path)
    with open(path, encoding="utf-8") as handle:
        original = handle.read()
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(original.replace(mutant.snippet, mutant.replacement, 1))
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("INFEROPS_NUMA_SHUFFLE", None)
    try:
        done = subprocess.run([python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                               "-o", "addopts="] + list(mutant.tests),
                              cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=PER_MUTANT_SECONDS)
        return done.returncode != 0
    except subprocess.TimeoutExpired:
        return True  # a mutant that hangs the tests is caught, if slowly
    finally:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(original)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("-k", dest="select", default="", help="only the mutants whose id contains this")
    parser.add_argument("--list", action="store_true", help="list the mutants and check their snippets; run none")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to run pytest with")
    args = parser.parse_args(argv)
    mutants = [mutant for mutant in MUTANTS if args.select in mutant.id]
    ids = [mutant.id for mutant in MUTANTS]
    duplicated = sorted(set(name for name in ids if ids.count(name) > 1))
    problems = check_snippets(REPO, mutants) + ["%s: id given twice" % name for name in duplicated]
    for problem in problems:
        print("SNIPPET %s" % problem)
    if args.list:
        for mutant in mutants:
            print("%-36s %s: %s" % (mutant.id, mutant.path, mutant.description))
        return 1 if problems else 0
    if problems:
        print("%d snippet(s) not found exactly once: update tests/mutants.py to the code" % len(problems))
        return 1
    survived = []
    with tempfile.TemporaryDirectory(prefix="numa-mutants-") as scratch:
        copy = os.path.join(scratch, "repo")
        shutil.copytree(REPO, copy, ignore=IGNORED, symlinks=True)
        for mutant in mutants:
            started = time.monotonic()
            killed = run_mutant(copy, mutant, args.python)
            print("%-8s %-36s %5.1f s  %s" % ("killed" if killed else "SURVIVED", mutant.id,
                                              time.monotonic() - started, mutant.description), flush=True)
            if not killed:
                survived.append(mutant)
    print("%d/%d mutants killed" % (len(mutants) - len(survived), len(mutants)))
    for mutant in survived:
        print("  SURVIVED %s (%s; run %s)" % (mutant.id, mutant.path, " ".join(mutant.tests)))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
