"""The guard of tests/unit/conftest.py is on: a unit test that starts a process fails, whichever way it tries."""
import os
import subprocess

import pytest

from tests.unit.conftest import ProcessStarted


@pytest.mark.parametrize("start", [
    lambda: subprocess.run(["true"], check=False),
    lambda: subprocess.check_output(["true"]),
    lambda: os.fork(),
    lambda: os.system("true"),
    lambda: os.posix_spawn("/bin/true", ["true"], {}),
    lambda: os.execv("/bin/true", ["true"]),
])
def test_starting_a_process_fails_the_test_and_says_where_it_belongs(start):
    with pytest.raises(ProcessStarted, match=r"tests/unit starts no process.*tests/integration/<name>_processes\.py"):
        start()
