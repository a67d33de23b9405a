"""root_files.resolve() (balancing's sysctl.d and tuned lookups) against the kernel's own answer: a forked child
chrooted at a generated tree reports what each path resolves to, and resolve() must agree (root only; a refused
chroot is a skip that says so)."""
import errno
import json
import os
import shutil
import tempfile

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.system import root_files


# A tree of a few names where each entry is a directory, a file or a symlink with an arbitrary
# target (absolute or relative, with '..' and '.'): the shapes that can escape a root.
NAMES = ("a", "b", "c")
TARGETS = st.lists(st.sampled_from(NAMES + ("..", ".")), min_size=1, max_size=5).flatmap(
    lambda parts: st.sampled_from(["/".join(parts), "/" + "/".join(parts)]))
ENTRY = st.one_of(st.just("dir"), st.just("file"), TARGETS)
TREE = st.dictionaries(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map("/".join), ENTRY, max_size=8)
QUERIES = st.lists(st.lists(st.sampled_from(NAMES + ("..",)), min_size=1, max_size=4).map("/".join),
                   min_size=1, max_size=4)


def build_tree(root, tree):
    for rel, entry in sorted(tree.items()):
        path = os.path.join(root, rel)
        if os.path.lexists(path) or not os.path.isdir(os.path.dirname(path)) or os.path.islink(
                os.path.dirname(path)):
            continue  # entries under a file or a link are not created: the parent decides
        if entry == "dir":
            os.mkdir(path)
        elif entry == "file":
            with open(path, "w") as handle:
                handle.write("x")
        else:
            os.symlink(entry, path)


def realpaths_chrooted(root, queries):
    """What the kernel makes of each path for a process chrooted at root (None when links loop or its directory
    cannot be reached).

    The forked child reports ``{"answers": [...]}`` or ``{"refused": errno, "why": ...}`` when chroot itself
    is refused; anything else (a crash, a short or missing report) fails here: a child that could not do
    its part never leaves the test with nothing compared."""
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked child
        report = {"error": "the child stopped before answering"}
        try:
            os.close(reader)
            try:
                os.chroot(root)
            except OSError as exc:
                report = {"refused": exc.errno, "why": exc.strerror}
            else:
                answers = []
                for query in queries:
                    try:
                        os.stat("/" + query)
                    except OSError as exc:
                        # A loop, or a path whose directory the kernel cannot reach (a name missing before a
                        # '..', a link looping there): nothing resolves it, realpath's lexical guess included.
                        unreachable = not os.path.isdir(os.path.dirname(os.path.realpath("/" + query)))
                        if exc.errno == errno.ELOOP or unreachable:
                            answers.append(None)
                            continue
                    answers.append(os.path.realpath("/" + query))
                report = {"answers": answers}
        except BaseException as exc:  # reported to the parent, which fails the test with it
            report = {"error": "%s: %s" % (type(exc).__name__, exc)}
        finally:
            os.write(writer, json.dumps(report).encode())
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as pipe:
        text = pipe.read()
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the chrooted child died (status %d)" % status
    report = json.loads(text)
    if "refused" in report:
        return report
    assert "answers" in report, "the chrooted child could not answer: %s" % report.get("error")
    assert len(report["answers"]) == len(queries), (report, queries)
    return report


_CHROOT = []


def chroot_refusal():
    """Why this process cannot chroot (None when it can), found once by a child chrooting at an empty dir."""
    if not _CHROOT:
        root = tempfile.mkdtemp(prefix="numa-chroot-probe-")
        try:
            report = realpaths_chrooted(root, ["."])
        finally:
            shutil.rmtree(root)
        _CHROOT.append(None if "answers" in report else "chroot(2) is refused here (%s, errno %d): the kernel's "
                       "own answer cannot be had, nothing to compare resolve() with"
                       % (report["why"], report["refused"]))
    return _CHROOT[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="the kernel's own answer needs chroot, which needs root")
@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(tree=TREE, queries=QUERIES)
def test_resolve_agrees_with_the_kernel_chrooted_at_root(tree, queries):
    refusal = chroot_refusal()
    if refusal:  # root without CAP_SYS_CHROOT (a container's default): skipped, saying so, not passed empty
        pytest.skip(refusal)
    root = tempfile.mkdtemp(prefix="numa-resolve-")
    try:
        build_tree(root, tree)
        report = realpaths_chrooted(root, queries)
        assert "answers" in report, "chroot worked in the probe but not here: %s" % report
        kernel = report["answers"]
        compared = 0
        for query, expected in zip(queries, kernel):
            resolved = root_files.resolve(root, "/" + query)
            if expected is None:  # a loop, or no way there: the path is left as given and opening it fails
                with pytest.raises(OSError):
                    root_files.read_config(root, "/" + query)
            else:
                assert resolved == expected, (tree, query)
            compared += 1
        assert compared == len(queries) >= 1
    finally:
        shutil.rmtree(root)


def test_a_refused_chroot_is_reported_not_taken_for_an_empty_answer(monkeypatch, tmp_path):
    """The child's report when chroot(2) fails: the refusal, never an empty list of answers."""
    def refuse(_root):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "chroot", refuse)
    assert realpaths_chrooted(str(tmp_path), ["a", "b"]) == {"refused": errno.EPERM, "why": "Operation not permitted"}
