"""lab/llama/build_server.sh's progress while it compiles (the compile itself is make test's llama-server phase)."""

import os
import re
import subprocess
import time

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "lab", "llama",
                      "build_server.sh")


def _function(name):
    with open(SCRIPT) as handle:
        text = handle.read()
    match = re.search(r"^%s\(\) \{\n.*?^\}\n" % name, text, re.MULTILINE | re.DOTALL)
    assert match, name
    return match.group(0)


def test_the_compile_reports_its_time_and_the_logs_last_step_until_it_ends(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("-- Configuring done\n")
    script = _function("report_progress") + 'report_progress "%s" &\nsleep 0.7\n' % log
    script += "echo '[ 12%%] Building C object ggml.c.o' >> '%s'\n" % log
    script += "echo '[ 45%%] Building CXX object server.cpp.o' >> '%s'\n" % log
    script += "sleep 0.7\nkill %1\nwait\n"
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", script], env=dict(os.environ, BUILD_PROGRESS_SECONDS="0.3"),
                          capture_output=True, text=True, timeout=30, check=False)
    lines = done.stderr.splitlines()
    assert time.monotonic() - started < 10 and done.stdout == ""
    assert lines and all(re.match(r"^build_server: compiling llama-server, 0:0\d so far: ", line) for line in lines)
    assert lines[0].endswith("so far: configuring")
    assert lines[-1].endswith("so far: [ 45%] Building CXX object server.cpp.o")
