#!/usr/bin/env python3
"""A stand-in inference engine: llama-server's and an OpenAI-compatible server's API, answered right (mode ``ok``)
or wrong in one way each (MODES), for the A/B gate and the readiness probe to be driven against.

    python3 tests/helpers/standin_engine.py --port N --mode MODE [--rate R] [--delay S]
        [--health-after S] [--exit-code N --exit-after S]

or in a test, in this process (a ThreadingHTTPServer on 127.0.0.1, a free port, a thread)::

    with StandinEngine("trickle") as engine:
        engine.url("/health")

Paths: ``/health`` (``{"status": "ok"}``; 503 until ``health_after`` seconds have passed), ``/completion``
(llama-server: ``{"content", "tokens_predicted", "timings": {"predicted_per_second": rate}}``), ``/v1/models``
(``{"data": [{"id": ...}]}``) and ``/v1/completions`` (``{"choices": [...], "usage": {"completion_tokens": n}}``,
n the request's ``max_tokens``, answered after n / rate seconds: that rate is timed by the client). Body modes change what the JSON paths answer and leave ``/health``'s status at 200;
exchange modes change the exchange on every path. ``crash`` (script only) prints one line to stderr and exits 1
at once, as a server that cannot start does; ``--exit-code N --exit-after S`` serves, then says so on stderr and
exits N after S seconds (a server that dies under systemd).

Python 3 standard library only: a fake systemd's ExecStart may run it with the system's python3.
"""

import argparse
import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL_ID = "standin-model"
# Larger than measure/engine_http.MAX_ANSWER_BYTES (1 MiB).
HUGE_BYTES = 2 << 20
# Deeper than any JSON parser's recursion limit.
DEEP_NESTING = 100000
TRICKLE_SECONDS = 1.0
DEFAULT_DELAY = 30.0

BODY_MODES = {
    "wrong-type": "a list where a number belongs (predicted_per_second, completion_tokens)",
    "models-dict": "/v1/models' data an object instead of a list",
    "huge-number": "numbers 1e400 (Python's json reads inf)",
    "big-int": "numbers of 400 digits",
    "nan": "the NaN literal where a number belongs",
    "infinity": "the Infinity literal where a number belongs",
    "zero": "a rate of 0 and 0 completion tokens",
    "deep": "an array nested %d deep" % DEEP_NESTING,
    "missing": "an object without the fields asked for",
    "not-object": "a JSON list instead of an object",
    "huge": "a valid answer of %d bytes" % HUGE_BYTES,
    "not-json": "an HTML page",
    "not-utf8": "bytes that are no UTF-8",
}
EXCHANGE_MODES = {
    "slow": "sleeps --delay seconds before answering",
    "trickle": "sends its whole answer one byte a second",
    "redirect": "302 to another server",
    "error": "500 with a text body",
    "dead-close": "accepts the connection and closes it",
    "dead-silent": "accepts the connection and never answers",
    "short": "announces a Content-Length and closes after half of it",
}
MODES = dict({"ok": "every answer right"}, **BODY_MODES, **EXCHANGE_MODES)


def good_answer(path, request, rate):
    """What a healthy engine answers to ``path``."""
    tokens = request.get("max_tokens") or request.get("n_predict") or 16
    if path == "/completion":
        return {"content": " hello" * tokens, "tokens_predicted": tokens,
                "timings": {"predicted_per_second": rate, "predicted_n": tokens}}
    if path == "/v1/models":
        return {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]}
    if path == "/v1/completions":
        return {"object": "text_completion", "model": MODEL_ID,
                "choices": [{"index": 0, "text": " hello" * tokens, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}}
    return None


# A placeholder for a number JSON cannot be made to hold by json.dumps (1e400), replaced in the text.
LITERAL = "@@literal@@"
LITERALS = {"huge-number": "1e400", "big-int": "9" * 400, "nan": "NaN", "infinity": "Infinity", "zero": "0"}


def body_of(mode, path, request, rate):
    """The bytes an engine in ``mode`` answers to ``path`` (None: no such path)."""
    answer = good_answer(path, request, rate)
    if answer is None:
        return None
    if mode == "huge":
        answer["padding"] = "x" * HUGE_BYTES
    elif mode in LITERALS or mode == "wrong-type":
        _spoil_numbers(answer, mode)
    elif mode == "models-dict" and path == "/v1/models":
        answer["data"] = {"id": MODEL_ID}
    elif mode == "deep":
        return b"[" * DEEP_NESTING + b"]" * DEEP_NESTING
    elif mode == "missing":
        return b'{"object": "nothing asked for"}'
    elif mode == "not-object":
        answer = [answer]
    elif mode == "not-json":
        return b"<html><body>\x1b[31mBad Gateway\x1b[0m\n</body></html>"
    elif mode == "not-utf8":
        return b'{"timings": {"predicted_per_second": 10}, "content": "\xff\xfe\xc3\x28"}'
    return json.dumps(answer).replace('"%s"' % LITERAL, LITERALS.get(mode, "")).encode()


def _spoil_numbers(answer, mode):
    """The rate, the token count and the model list's entry made wrong: a list each in mode wrong-type, else the
    mode's literal."""
    for outer, key in (("timings", "predicted_per_second"), ("usage", "completion_tokens")):
        if outer in answer:
            number = answer[outer][key]
            answer[outer][key] = [number] if mode == "wrong-type" else LITERAL
    if mode == "wrong-type" and "data" in answer:
        answer["data"] = [[MODEL_ID]]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "standin-engine/1"

    def do_GET(self):
        self._answer({})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            request = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            request = {}
        self._answer(request if isinstance(request, dict) else {})

    def _answer(self, request):
        engine = self.server.engine
        mode, path = engine.mode, self.path.split("?", 1)[0]
        if mode == "dead-close":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if mode == "dead-silent":
            engine.stopping.wait()
            self.close_connection = True
            return
        if mode == "slow" and engine.stopping.wait(engine.delay):
            return
        if mode == "redirect":
            return self._send(302, b"", "text/plain", {"Location": "http://127.0.0.1:9/elsewhere" + path})
        if mode == "error":
            return self._send(500, b"Internal Server Error: \x1b[2Jmodel crashed\n", "text/plain")
        if path == "/health":
            ready = time.monotonic() >= engine.ready_at
            body = json.dumps({"status": "ok"} if ready else {"error": {"code": 503, "message": "Loading model"}})
            return self._send(200 if ready else 503, body.encode(), "application/json")
        body = body_of(mode, path, request, engine.rate)
        if path == "/v1/completions" and engine.stopping.wait((request.get("max_tokens") or 16) / engine.rate):
            return  # generating at the engine's rate: an OpenAI-compatible server's rate is timed
        if body is None:
            return self._send(404, b'{"error": "not found"}', "application/json")
        self._send(200, body, "application/json")

    def _send(self, status, body, kind, headers=None):
        mode = self.server.engine.mode
        announced = len(body) * 2 if mode == "short" else len(body)
        head = ["HTTP/1.1 %d %s" % (status, self.responses.get(status, ("",))[0]),
                "Content-Type: %s" % kind, "Content-Length: %d" % announced]
        head += ["%s: %s" % item for item in (headers or {}).items()]
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        if mode == "trickle":
            for index in range(len(data)):
                if self.server.engine.stopping.wait(TRICKLE_SECONDS):
                    return
                self.wfile.write(data[index:index + 1])
                self.wfile.flush()
        else:
            self.wfile.write(data)
        if mode == "short":
            self.close_connection = True

    def log_message(self, *args):
        pass


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        """A client that hangs up (the gate cuts a huge or slow answer short) is no error of the stand-in's."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class StandinEngine:
    """The stand-in served from a thread of this process on 127.0.0.1 (``port`` 0: a free one)."""

    def __init__(self, mode="ok", rate=10.0, port=0, delay=DEFAULT_DELAY, health_after=0.0):
        if mode not in MODES:
            raise ValueError("unknown mode %r: one of %s" % (mode, ", ".join(MODES)))
        if not rate > 0:
            raise ValueError("a rate of %r tokens/s: give a positive one" % rate)
        self.mode, self.rate, self.delay = mode, float(rate), float(delay)
        self.ready_at = time.monotonic() + health_after
        self.stopping = threading.Event()
        self.server = QuietServer(("127.0.0.1", port), Handler)
        self.server.engine = self
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="standin-engine", daemon=True)

    def url(self, path=""):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.stopping.set()  # wakes the handlers that sleep or never answer
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", default="ok", choices=sorted(list(MODES) + ["crash"]))
    parser.add_argument("--rate", type=float, default=10.0, help="tokens/s the engine reports")
    parser.add_argument("--delay", type=float, default=DEFAULT_DELAY, help="seconds mode slow sleeps")
    parser.add_argument("--health-after", type=float, default=0.0, help="/health answers 503 until then")
    parser.add_argument("--exit-code", type=int, default=1, help="the code of --exit-after and of mode crash")
    parser.add_argument("--exit-after", type=float, default=None, help="serve this long, then exit --exit-code")
    args = parser.parse_args(argv)
    if args.mode == "crash":
        sys.stderr.write("standin-engine: error: failed to load model '/models/standin.gguf'\n")
        return args.exit_code
    engine = StandinEngine(args.mode, args.rate, args.port, args.delay, args.health_after).start()
    sys.stderr.write("standin-engine: serving mode %s on 127.0.0.1:%d\n" % (args.mode, engine.port))
    sys.stderr.flush()
    try:
        if engine.stopping.wait(args.exit_after):
            return 0
        sys.stderr.write("standin-engine: exiting with %d after %g s\n" % (args.exit_code, args.exit_after))
        return args.exit_code
    except KeyboardInterrupt:
        return 0
    finally:
        engine.stop()


if __name__ == "__main__":
    sys.exit(main())
