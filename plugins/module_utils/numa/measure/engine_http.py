"""The one HTTP client for a host's own inference engine: its readiness probe and the A/B gate's requests.

An engine's answer is data from a process we do not control (a bug, an update, another server on its port), so:

- http.client, not urllib: no proxy from the environment stands between a host and its own server, and a
  redirect is not followed (a 3xx is a status like any other: the URL asked is the one judged);
- one deadline per request, shared by the connection, the TLS handshake, sending and every read: a socket's
  timeout alone applies to each read, so a server that sends a byte a second would hold a request for as long as
  it likes;
- an answer's body is read up to ``MAX_ANSWER_BYTES``, and more is an error, not a longer wait;
- JSON is parsed into an object or refused (``json_object``), and a number read from it is an int or float within
  its bounds after conversion (``finite``): Python's json gives ``inf`` for ``1e400``, ``nan`` for ``NaN``, an
  int of any length, and RecursionError for deep nesting.

Every failure is a NumaError of one line: what was asked, what came back (cut short, control characters escaped:
the text is the host's), and the fix. A host name in a URL is resolved before the deadline starts counting:
the engine's own URLs name an address (127.0.0.1).
"""

from __future__ import annotations

import io
import json
import math
import select
import socket
import ssl
import time
from http import client as http_client
from typing import NamedTuple
from urllib.parse import urlsplit

from ..base.engines import APIS
from ..base.errors import NumaError, shown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Mapping, Optional, Tuple

# Far more than any answer to the gate's questions (a completion of 4096 tokens is some 30 KB of JSON), far less
# than would matter in memory.
MAX_ANSWER_BYTES = 1 << 20
# How much of a refused answer a message repeats.
EXCERPT_BYTES = 120
# What to check when an answer is not what the engine's API gives.
ANSWER_FIX = "check that the server on that port is the engine the gate's api names (%s)" % " or ".join(APIS)


class Answer(NamedTuple):
    """An engine's answer: its HTTP status and its body (at most MAX_ANSWER_BYTES)."""
    status: int
    body: bytes


def request(url: str, seconds: float, body: Optional[Mapping[str, Any]] = None) -> Answer:
    """GET ``url`` (POST ``body`` as JSON when given), all of it within ``seconds``; any status is an Answer.

    NumaError when there is no whole answer in time, or a larger one than MAX_ANSWER_BYTES."""
    status, data, _headers = _exchange(url, seconds, body, MAX_ANSWER_BYTES)
    return Answer(status, data)


def status_problem(url: str, seconds: float) -> Optional[str]:
    """None when ``url`` answers HTTP 200 within ``seconds``, else what was seen (a readiness probe: the body is
    not read)."""
    try:
        status, _data, headers = _exchange(url, seconds, None, 0)
    except NumaError as exc:
        return str(exc)
    if status == 200:
        return None
    if 300 <= status < 400:
        return "%s answered %d, a redirect to %s: not followed; give the health URL itself" % (
            url, status, _escaped(headers.get("Location") or "nowhere"))
    return "%s answered %d" % (url, status)


def answer_object(answer: Answer, url: str) -> Dict[str, Any]:
    """The JSON object of an HTTP 200 answer from ``url``; NumaError for any other status or body."""
    if answer.status != 200:
        raise NumaError("%s answered %d: %s; check the engine's log" % (url, answer.status, excerpt(answer.body)))
    return json_object(answer.body, url)


def json_object(answer_body: bytes, what: str) -> Dict[str, Any]:
    """The JSON object ``answer_body`` holds; NumaError (naming ``what`` answered it) for anything else."""
    try:
        text = answer_body.decode("utf-8")
    except UnicodeDecodeError:
        raise NumaError("%s answered no UTF-8 text: %s; %s" % (what, excerpt(answer_body), ANSWER_FIX)) from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise NumaError("%s answered JSON nested too deep to read: %s; %s" % (what, excerpt(answer_body), ANSWER_FIX)
                        ) from None
    except ValueError:  # not JSON, or an int past Python's 4300 digits
        raise NumaError("%s answered no JSON: %s; %s" % (what, excerpt(answer_body), ANSWER_FIX)) from None
    if not isinstance(value, dict):
        raise NumaError("%s answered %s, not a JSON object; %s" % (what, described(value), ANSWER_FIX))
    return value


def finite(value: Any, what: str, low: float, high: float) -> float:
    """``value`` as a float when it is an int or float (not a bool) from ``low`` to ``high``; else NumaError."""
    number = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int past a float's range
            pass
    if not low <= number <= high:  # NaN compares false
        raise NumaError("%s is %s, not a number from %g to %g; %s" % (what, described(value), low, high, ANSWER_FIX))
    return number


def described(value: Any) -> str:
    """A JSON value named in a message: a number or a text cut short; a list or an object by its size (repr() of a
    deeply nested one raises RecursionError)."""
    if isinstance(value, dict):
        return "an object of %d key(s)" % len(value)
    if isinstance(value, list):
        return "a list of %d item(s)" % len(value)
    if value is None:
        return "null"
    return shown(value)


def excerpt(data: bytes) -> str:
    """The start of an answer's body as one line: invalid UTF-8 and control characters escaped, its size when cut."""
    text = _escaped(data[:EXCERPT_BYTES].decode("utf-8", "backslashreplace"))
    return text if len(data) <= EXCERPT_BYTES else "%s... (%d bytes)" % (text, len(data))


def _escaped(text: str) -> str:
    """``text`` cut to EXCERPT_BYTES characters, every control and unprintable character escaped as repr() escapes
    it (newlines, ESC, bidirectional overrides); excerpt()'s ``\\xff`` for a byte that is no UTF-8 stays as it is."""
    if not text:
        return "(nothing)"
    return "".join(character if character.isprintable() else repr(character)[1:-1]
                   for character in text[:EXCERPT_BYTES]) + ("..." if len(text) > EXCERPT_BYTES else "")


# ----------------------------------------------------------------- the exchange


def _exchange(url: str, seconds: float, body: Optional[Mapping[str, Any]], limit: int
              ) -> Tuple[int, bytes, http_client.HTTPMessage]:
    """(status, up to ``limit`` bytes of the body, headers) of one request, all of it before the deadline."""
    scheme, host, port, target = _parts(url)
    deadline = _Deadline(seconds, url)
    payload = None if body is None else json.dumps(body).encode("utf-8")
    raw = None  # type: Optional[socket.socket]
    try:
        raw = _connected(scheme, host, port, deadline)
        connection = http_client.HTTPConnection(host, port)
        connection.sock = _DeadlineSocket(raw, deadline)  # given, so http.client never connects by itself
        headers = {"Accept": "application/json"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        connection.request("GET" if payload is None else "POST", target, payload, headers)
        response = connection.getresponse()
        data = response.read(limit + 1) if limit else b""
        if len(data) > limit:
            raise NumaError("%s answered more than %d bytes: %s; %s" % (url, limit, excerpt(data), ANSWER_FIX))
        if limit and response.length:  # its Content-Length promised more than came before the server closed
            raise NumaError("%s answered %d bytes of the %d it announced: %s; check the engine's log"
                            % (url, len(data), len(data) + response.length, excerpt(data)))
        return response.status, data, response.msg
    except socket.timeout:
        raise NumaError("%s: no whole answer within %g s (the server stalls or trickles); check its log and its "
                        "load, or give it more time" % (url, seconds)) from None
    except ssl.SSLError as exc:
        raise NumaError("%s: TLS failed (%s); give the server's http:// URL or a certificate this host trusts"
                        % (url, _escaped(str(exc)))) from None
    except (OSError, http_client.HTTPException, ValueError) as exc:
        raise NumaError("%s: %s; check that the server runs and answers HTTP on that port"
                        % (url, _escaped(_reason(exc)))) from None
    finally:
        if raw is not None:
            raw.close()


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if isinstance(exc, http_client.RemoteDisconnected):
        return "closed the connection without an answer"
    return "%s: %s" % (type(exc).__name__, exc) if str(exc) else type(exc).__name__


def _parts(url: str) -> Tuple[str, str, Optional[int], str]:
    """(scheme, host, port, path and query) of an http(s) URL; NumaError for anything else."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        port, parts = None, None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise NumaError("%s is not an http(s) URL with a host; give one such as http://127.0.0.1:8080/health"
                        % _escaped(url))
    return parts.scheme, parts.hostname, port, (parts.path or "/") + ("?" + parts.query if parts.query else "")


def _connected(scheme: str, host: str, port: Optional[int], deadline: _Deadline) -> socket.socket:
    """A socket connected to ``host`` (TLS for https: verified as http.client verifies), before the deadline."""
    sock = socket.create_connection((host, port or (443 if scheme == "https" else 80)), timeout=deadline.left())
    if scheme == "http":
        return sock
    try:
        secure = ssl.create_default_context().wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
    except BaseException:
        sock.close()
        raise
    _handshake(secure, deadline)
    return secure


def _handshake(secure: ssl.SSLSocket, deadline: _Deadline) -> None:
    # Non-blocking, so a server that trickles its handshake is cut off at the deadline too.
    secure.setblocking(False)
    try:
        while True:
            try:
                secure.do_handshake()
                return
            except ssl.SSLWantReadError:
                waited = select.select([secure], [], [], deadline.left())[0]
            except ssl.SSLWantWriteError:
                waited = select.select([], [secure], [], deadline.left())[1]
            if not waited:
                raise socket.timeout("TLS handshake")
    except BaseException:
        secure.close()
        raise


class _Deadline:
    """The moment a request must be done by; ``left()`` raises socket.timeout once it has passed."""

    def __init__(self, seconds: float, url: str, clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(seconds, bool) or not (isinstance(seconds, (int, float)) and 0 < seconds < math.inf):
            raise NumaError("%s: a request's time limit must be a positive number of seconds, not %s"
                            % (url, shown(seconds)))
        self._clock = clock
        self._end = clock() + seconds

    def left(self) -> float:
        left = self._end - self._clock()
        if left <= 0:
            raise socket.timeout("deadline")
        return left


class _DeadlineSocket:
    """What http.client uses of a socket (sendall, makefile), each send and read bounded by what is left of one
    deadline. Closing it leaves the socket to its owner (``_exchange``), which closes it once."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self._sock = sock
        self._deadline = deadline

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(self._deadline.left())  # sendall's timeout covers all of it (Python 3.5+)
        self._sock.sendall(data)

    def recv_into(self, buffer: Any) -> int:
        self._sock.settimeout(self._deadline.left())
        return self._sock.recv_into(buffer)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self))

    def close(self) -> None:
        pass


class _DeadlineReader(io.RawIOBase):
    """The raw stream under http.client's buffered reads: every read waits only for what is left of the deadline."""

    def __init__(self, sock: _DeadlineSocket) -> None:
        super().__init__()
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._sock.recv_into(buffer)
