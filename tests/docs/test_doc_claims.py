"""What the shipped docs claim, held to the repository: their links resolve, and they quote no test counts or test
timings (those go stale with every test added; measured figures live in the maintainers' notes,
lab/docs/benchmarks.md, which does not ship).
"""

import glob
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED_DOCS = ["README.md"] + sorted(os.path.relpath(path, REPO) for path in
                                      glob.glob(os.path.join(REPO, "docs", "*.md")) +
                                      glob.glob(os.path.join(REPO, "roles", "*", "README.md")))
ALL_DOCS = SHIPPED_DOCS + sorted(os.path.relpath(path, REPO) for path in
                                 glob.glob(os.path.join(REPO, "lab", "**", "*.md"), recursive=True))
LINK = re.compile(r"\]\(([^)\s]+)\)")
# "390 seeded mutations", "61 mutants", "1369 tests", "72 lab checks".
COUNT = re.compile(r"\b\d+ (?:[\w-]+ )?(?:tests?|mutants|checks|mutations|test modules)\b")
# "4 min", "6 minutes", "46:59", "120 s": a duration, judged only beside the commands that run the checks.
DURATION = re.compile(r"\b\d+(?:[.-]\d+)? ?(?:min|minutes|s|seconds)\b|\b\d+:\d\d\b")
RUNS_CHECKS = re.compile(r"make (?:test|demo|mutants|unit|molecule)\b|tests/|molecule\b")


def _read(path):
    with open(os.path.join(REPO, path)) as handle:
        return handle.read()


def _prose(text):
    """The paragraphs outside fenced blocks (a block's contents are commands and their output)."""
    kept, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            kept.append("")
        elif not inside:
            kept.append(line)
    return [paragraph for paragraph in "\n".join(kept).split("\n\n") if paragraph.strip()]


def test_every_relative_link_in_the_docs_resolves():
    dead = []
    for path in ALL_DOCS:
        for target in LINK.findall(_read(path)):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            resolved = os.path.normpath(os.path.join(os.path.dirname(os.path.join(REPO, path)), target.split("#")[0]))
            if not os.path.exists(resolved):
                dead.append((path, target))
    assert "docs/capture.md" in SHIPPED_DOCS and "lab/docs/benchmarks.md" in ALL_DOCS
    assert dead == []


def test_the_shipped_docs_quote_no_test_counts_or_timings():
    found = []
    for path in SHIPPED_DOCS:
        for paragraph in _prose(_read(path)):
            found += [(path, match) for match in COUNT.findall(paragraph)]
            if RUNS_CHECKS.search(paragraph):
                found += [(path, match) for match in DURATION.findall(paragraph)]
    assert found == [], "measured figures belong in lab/docs/benchmarks.md"


def test_the_maintainers_notes_are_not_among_the_shipped_docs():
    assert not [path for path in SHIPPED_DOCS if os.path.basename(path) in ("benchmarks.md", "llama.md")]
    assert re.search(r"\d+ min \d+ s", _read("lab/docs/benchmarks.md"))  # the one place with the suite's timings


def test_every_doc_that_passes_root_a_capture_links_how_to_capture_one():
    """``--root DUMP`` means nothing to a reader who never captured a machine: docs/capture.md says how."""
    naming = [path for path in SHIPPED_DOCS if re.search(r"--root (?:DIR|DUMP)\b", _read(path))]
    assert "README.md" in naming and "docs/engines.md" in naming
    unlinked = [path for path in naming if path != "docs/capture.md" and not re.search(
        r"\]\((?:docs/|\./)?capture\.md\)", _read(path))]
    assert unlinked == []
