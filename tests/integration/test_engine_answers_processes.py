"""The A/B gate's requests (measure/ab_gate.measure) and the readiness probe (measure/engine_http.status_problem)
against a stand-in engine on loopback (tests/helpers/standin_engine.py) answering wrong in every way it knows: each
ends in a NumaError of one line that names the URL, within the request's deadline, never another exception; a right
engine is measured."""

import os
import re
import subprocess
import sys
import time

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.measure import ab_gate, engine_http
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from tests.helpers.standin_engine import BODY_MODES, EXCHANGE_MODES, StandinEngine

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers", "standin_engine.py")
DEADLINE = 1.5
# Thread start-up and a loaded machine's scheduling; a per-read timeout would be 10 s and more past it here.
SLACK = 0.75
SLOW = DEADLINE * 4

# What each wrong answer's message says, asked by either api (llama.cpp: /completion; openai: /v1/models first).
SAID = {
    "wrong-type": r"is a list of 1 item\(s\), not a number|lists no model to ask",
    "models-dict": r"answered data as an object of 1 key\(s\), not a list",
    "huge-number": r"is inf, not a number from",
    "big-int": r"is \(a 1329-bit number\), not a number from",
    "nan": r"is nan, not a number from",
    "infinity": r"is inf, not a number from",
    "zero": r"is 0, not a number from",
    "deep": r"answered JSON nested too deep to read: \[\[\[",
    "missing": r"answered (timings|usage|data) as null, not (an object|a list)",
    "not-object": r"answered a list of 1 item\(s\), not a JSON object",
    "huge": r"answered more than 1048576 bytes: .*\.\.\. \(1048577 bytes\)",
    "not-json": r"answered no JSON: <html><body>\\x1b\[31mBad Gateway",
    "not-utf8": r"answered no UTF-8 text: .*\\xff\\xfe",
    "slow": r"no whole answer within 1.5 s",
    "trickle": r"no whole answer within 1.5 s",
    "redirect": r"answered 302: \(nothing\); check the engine's log",
    "error": r"answered 500: Internal Server Error: \\x1b\[2Jmodel crashed\\n; check the engine's log",
    "dead-close": r"closed the connection without an answer",
    "dead-silent": r"no whole answer within 1.5 s",
    "short": r"answered \d+ bytes of the \d+ it announced",
}
# Modes whose wrong answer is on a path the api does not ask.
HARMLESS = {("models-dict", "llama.cpp")}


def gate(engine, api, rounds=3):
    return ab_gate.Gate(engine.url(), api, "Hi", 4, rounds, None, request_seconds=DEADLINE)


def test_every_mode_of_the_stand_in_has_its_message_here():
    assert set(SAID) == set(BODY_MODES) | set(EXCHANGE_MODES)


@pytest.mark.parametrize("api", ["llama.cpp", "openai"])
@pytest.mark.parametrize("mode", sorted(SAID))
def test_a_wrong_answer_is_a_one_line_error_within_the_deadline(mode, api):
    if (mode, api) in HARMLESS:
        pytest.skip("%s asks no path that mode %s spoils" % (api, mode))
    with StandinEngine(mode, delay=SLOW) as engine:
        started = time.monotonic()
        with pytest.raises(NumaError) as raised:
            ab_gate.measure(gate(engine, api))
        elapsed = time.monotonic() - started
    message = str(raised.value)
    assert elapsed < DEADLINE + SLACK, message
    assert re.search(SAID[mode], message), message
    assert engine.url() in message and "\n" not in message and len(message) < 700
    # what to do about it, after the cause
    assert re.search(r"; (check|give)", message), message


@pytest.mark.parametrize("api", ["llama.cpp", "openai"])
def test_a_right_engine_is_measured(api):
    with StandinEngine("ok", rate=50.0) as engine:
        rates = ab_gate.measure(gate(engine, api, rounds=5))
    if api == "llama.cpp":
        assert rates == [50.0] * 5  # the server's own rate, steady: no more rounds than asked
    else:  # 4 tokens in 80 ms and the exchange's own time, which a loaded machine can stretch in any one round
        median = sorted(rates)[len(rates) // 2]
        assert 5 <= len(rates) <= 15 and all(0.0 < rate <= 50.0 for rate in rates) and median > 25.0, rates


@pytest.mark.parametrize("mode", sorted(SAID))
def test_the_readiness_probe_reads_the_status_alone_within_the_deadline(mode):
    with StandinEngine(mode, delay=SLOW) as engine:
        url = engine.url("/health")
        started = time.monotonic()
        seen = engine_http.status_problem(url, DEADLINE)
        elapsed = time.monotonic() - started
    assert elapsed < DEADLINE + SLACK, seen
    if mode in BODY_MODES or mode == "short":
        assert seen is None  # a body is no business of a readiness probe: HTTP 200 is ready
        return
    assert seen.startswith(url) and "\n" not in seen, seen
    if mode == "redirect":
        assert seen == ("%s answered 302, a redirect to http://127.0.0.1:9/elsewhere/health: not followed; give the "
                        "health URL itself" % url)
    elif mode == "error":
        assert seen == "%s answered 500" % url
    else:
        assert re.search(SAID[mode], seen), seen


def test_a_loading_server_is_not_ready_until_it_is_and_https_to_plain_http_is_said():
    with StandinEngine("ok", health_after=1.0) as engine:
        url = engine.url("/health")
        assert engine_http.status_problem(url, DEADLINE) == "%s answered 503" % url
        time.sleep(1.0)
        assert engine_http.status_problem(url, DEADLINE) is None
        secure = url.replace("http://", "https://")
        assert re.match(re.escape(secure) + r": TLS failed \(.+\); give the server's http:// URL",
                        engine_http.status_problem(secure, DEADLINE))


def test_a_closed_port_and_a_url_that_is_none_are_said():
    with StandinEngine("ok") as engine:
        port = engine.port
    seen = engine_http.status_problem("http://127.0.0.1:%d/health" % port, DEADLINE)
    assert seen == ("http://127.0.0.1:%d/health: Connection refused; check that the server runs and answers HTTP on "
                    "that port" % port)
    assert engine_http.status_problem("ftp://127.0.0.1/\x1b[2J", DEADLINE) == (
        "ftp://127.0.0.1/\\x1b[2J is not an http(s) URL with a host; give one such as http://127.0.0.1:8080/health")
    with pytest.raises(NumaError, match="Connection refused"):
        engine_http.request("http://127.0.0.1:%d/" % port, DEADLINE)


def test_the_script_crashes_as_told_and_serves_until_it_exits():
    crashed = subprocess.run([sys.executable, SCRIPT, "--port", "0", "--mode", "crash"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, universal_newlines=True, timeout=30)
    assert crashed.returncode == 1 and crashed.stderr.count("\n") == 1 and "failed to load model" in crashed.stderr
    server = subprocess.Popen([sys.executable, SCRIPT, "--port", "0", "--health-after", "1", "--exit-code", "3",
                               "--exit-after", "3"], stderr=subprocess.PIPE, universal_newlines=True)
    try:
        url = "http://127.0.0.1:%s/health" % re.search(r":(\d+)$", server.stderr.readline().strip()).group(1)
        assert engine_http.status_problem(url, DEADLINE) == "%s answered 503" % url
        deadline = time.monotonic() + 10
        while engine_http.status_problem(url, DEADLINE) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert engine_http.status_problem(url, DEADLINE) is None
        assert server.wait(timeout=10) == 3
        assert server.stderr.read() == "standin-engine: exiting with 3 after 3 s\n"
    finally:
        server.kill()
        server.wait()
