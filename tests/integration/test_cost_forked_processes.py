"""cost.run_forked: each measurement in a forked child with a deadline, killed and reaped past it; a crash or
a kill is an error value, never an exception in the caller."""
import os
import signal
import time

from ansible_collections.inferops.numa.plugins.module_utils.numa.measure import cost
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_run_forked_returns_the_childs_dict():
    assert cost.run_forked(lambda: {"latency_ns": 1.5, "pid": os.getpid()}, 10)["latency_ns"] == 1.5


def test_run_forked_kills_and_reaps_a_child_past_its_deadline(tmp_path):
    marker = tmp_path / "pid"

    def hang():
        marker.write_text(str(os.getpid()))
        time.sleep(60)
        return {}
    begin = time.monotonic()
    assert cost.run_forked(hang, 0.5) is None
    assert time.monotonic() - begin < 10
    assert _gone(int(marker.read_text()))


def test_run_forked_reports_a_crash_as_an_error_not_an_exception():
    def boom():
        raise ZeroDivisionError("division by zero")
    assert cost.run_forked(boom, 10) == {"error": "measurement failed: ZeroDivisionError: division by zero"}
    numa = cost.run_forked(lambda: (_ for _ in ()).throw(NumaError("cause and fix")), 10)
    assert numa == {"error": "cause and fix"}


def test_run_forked_explains_a_child_killed_before_reporting():
    result = cost.run_forked(lambda: os.kill(os.getpid(), signal.SIGKILL), 10)
    assert "died before reporting" in result["error"]
