"""A service's traffic hooks: the command that takes an instance out of its load balancer before it is stopped or
restarted (drain), and the one that puts it back once it passed its gates (undrain).

A hook is an argv run on the host without a shell, its tokens already filled (base/tokens.HOOK_TOKENS), within a
deadline: a load balancer that does not answer must not hold a rollout for ever. Its output is captured, never
passed through (a module's stdout is its JSON), and a failure is one line: the command, how it ended, the last
line it wrote on stderr. What a failure means for the rollout (a drain stops it before the instance is touched,
an undrain leaves the instance without traffic, recorded for the next run) is act/rollout's to decide.
"""

from __future__ import annotations

import os
import signal
import subprocess  # nosec B404: argv lists only, never a shell
from typing import Callable, NamedTuple, Optional, Sequence, Tuple

from ..base.errors import NumaError, shown
from ..decide.rollout import HOOK_SECONDS
from ..read.kernel_files import printable

# The characters of a hook's last stderr line a failure quotes.
LAST_LINE_CHARS = 240


class Hooks(NamedTuple):
    """An instance's traffic hooks; an empty argv runs nothing."""
    drain: Tuple[str, ...] = ()
    undrain: Tuple[str, ...] = ()
    seconds: float = float(HOOK_SECONDS)  # each hook's deadline
    drain_seconds: float = 0.0  # the grace after a drain, for requests in flight to finish


HookRun = Callable[[Sequence[str], float], Tuple[int, str, str]]  # (argv, deadline) -> (rc, stdout, stderr)


def hooks_from(drain: Optional[Sequence[str]], undrain: Optional[Sequence[str]], seconds: float,
               drain_seconds: float) -> Hooks:
    """The checked hooks of an instance; NumaError for a deadline that is not positive or a negative grace."""
    if not seconds > 0:  # written so that NaN is refused too
        raise NumaError("hook_seconds %s: give each hook's deadline in seconds, more than 0" % shown(seconds))
    if not drain_seconds >= 0:
        raise NumaError("drain_seconds %s: give the seconds to wait after a drain, 0 or more" % shown(drain_seconds))
    return Hooks(tuple(drain or ()), tuple(undrain or ()), float(seconds), float(drain_seconds))


def run_hook(argv: Sequence[str], seconds: float) -> Tuple[int, str, str]:
    """Run ``argv`` (no shell, no stdin) and wait at most ``seconds``: (exit code, stdout, stderr). NumaError when
    it cannot start, or is still running at the deadline (then it and whatever it started in its session are
    killed: a hook's children must not outlive its rollout step)."""
    try:
        process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,  # nosec B603
                                   stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        raise NumaError("could not run: %s" % (exc.strerror or exc)) from None
    try:
        out, err = process.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.communicate()
        raise NumaError("still running after %g s (hook_seconds), killed" % seconds) from None
    return process.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def hook_problem(kind: str, argv: Sequence[str], seconds: float, run: HookRun) -> Optional[str]:
    """None when the ``kind`` hook (drain, undrain) ``argv`` exits 0 within ``seconds``, else one line: the
    command, its exit code or why it has none, and the last line it wrote on stderr (else stdout)."""
    command = printable(" ".join(argv))
    try:
        rc, out, err = run(argv, seconds)
    except NumaError as exc:
        return "its %s command `%s` %s" % (kind, command, exc)
    if rc == 0:
        return None
    lines = [line.strip() for line in (err or out).splitlines() if line.strip()]
    said = printable(lines[-1])[:LAST_LINE_CHARS] if lines else "it wrote nothing"
    ended = "was killed by signal %d" % -rc if rc < 0 else "exited %d" % rc
    return "its %s command `%s` %s: %s" % (kind, command, ended, said)
