"""Observation of vLLM over HTTP (/health, /metrics), in a thread of its own.

The loop only reads what this thread last saw: a slow or hung vLLM HTTP server can never delay
a signal or the deadline.
"""

from __future__ import annotations

import http.client
import io
import re
import socket
import threading
import time
import urllib.parse

from ..in_vllm.run_files import Result
from .timing import HEALTH_TIMEOUT_S, METRICS_TIMEOUT_S, TICK_S

ANSWER_MAX = 4 << 20  # bytes of an answer read at most (vLLM's /metrics is far below it)
HEALTH_MAX = 64 << 10  # /health's answer: a status line, a few headers, an empty body


def http_get(url: str, path: str, timeout: float, limit: int = ANSWER_MAX) -> tuple[int, str]:
    """(status, body) of GET url/path; (0, why) without a whole, well-formed answer of at most
    `limit` bytes within `timeout`. url: the server's base address (settings.poll_url).

    Invariants: never raises, whatever the server sends (cut, slow, malformed); `timeout` bounds
    the whole call (connect, TLS, request, answer; a host name's look-up aside), not each socket
    operation; every HTTP request the supervisor and `probe` make goes straight to this host's
    vLLM on a socket of its own, never through a proxy, whatever http_proxy / no_proxy say (a
    proxy could answer for vLLM)."""
    end = time.monotonic() + timeout
    got = bytearray()
    try:
        tls, host, port = target(url)
        sock = connect(host, port, end)
        try:
            sock.settimeout(left(end))  # bounds the TLS handshake as a whole; the request is small
            if tls:
                sock = tls_context().wrap_socket(sock, server_hostname=host)
            sock.sendall(request(host, port, path))
            while len(got) <= limit:
                sock.settimeout(left(end))
                if not (data := sock.recv(65536)):
                    break
                got += data
        finally:
            sock.close()
    except (OSError, ValueError) as e:  # socket.timeout and ssl.SSLError are OSErrors
        return parse_answer(bytes(got), limit, e)
    return parse_answer(bytes(got), limit)


def target(url: str) -> tuple[bool, str, int]:
    """(tls, host, port) of an http(s) base address; ValueError if it is none."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    tls = parts.scheme == "https"
    return tls, parts.hostname, parts.port or (443 if tls else 80)


def request(host: str, port: int, path: str) -> bytes:
    """The request: one GET, the connection closed after the answer (so the answer ends at EOF)."""
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"GET {path} HTTP/1.1\r\nHost: {netloc}\r\nConnection: close\r\n\r\n".encode("ascii")


def tls_context():
    """Our own server, reached by loopback or its bind address: its certificate names the public
    host, not that address, so only the encryption is used, not the verification."""
    import ssl

    return ssl._create_unverified_context()


def left(end: float) -> float:
    """Seconds until `end` (time.monotonic()); TimeoutError once it has passed."""
    remaining = end - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("timed out")
    return remaining


def connect(host: str, port: int, end: float) -> socket.socket:
    """A socket connected to host:port by `end`, each address of the name tried in turn."""
    error: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _, addr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(left(end))
            sock.connect(addr)
            return sock
        except OSError as e:
            sock.close()
            error = e
    raise error


class Received:
    """The bytes of an answer, read by http.client.HTTPResponse as it reads a socket."""

    def __init__(self, raw: bytes):
        self.raw = raw

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self.raw)


def parse_answer(raw: bytes, limit: int, stopped: Exception | None = None) -> tuple[int, str]:
    """(status, body) of the HTTP answer in `raw`, (0, why) if it is not a whole, well-formed one
    of at most `limit` bytes. stopped: why the read ended before the server closed (None: it
    closed); then only an answer whose headers say where its body ends can be whole."""
    why = (str(stopped) or type(stopped).__name__) if stopped else ""
    if len(raw) > limit:
        return 0, f"an answer over {limit} bytes"
    if not raw:
        return 0, why or "closed without an answer"
    cut = f"{why} before the end of the answer" if why else "a cut answer"
    if b"\r\n\r\n" not in raw and b"\n\n" not in raw:  # http.client takes EOF for the blank line
        return 0, cut
    res = http.client.HTTPResponse(Received(raw), method="GET")
    try:
        res.begin()
        if stopped and res.length is None and not res.chunked:
            return 0, cut  # the body ends where the server closes, which it has not
        body = res.read()
    except http.client.IncompleteRead:
        return 0, cut
    except (http.client.HTTPException, ValueError) as e:
        return 0, f"a malformed answer ({type(e).__name__})"
    return res.status, body.decode("utf-8", "replace")


def healthy(url: str, timeout: float = HEALTH_TIMEOUT_S) -> bool:
    return http_get(url, "/health", timeout, HEALTH_MAX)[0] == 200


COUNTED = re.compile(r"vllm:(num_requests_running|num_requests_waiting|request_success)")


def parse_counts(text: str) -> dict[str, float]:
    """Requests running, waiting, finished and aborted, from vLLM's Prometheus exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    counts = {"running": 0.0, "waiting": 0.0, "finished": 0.0, "aborted": 0.0}
    # Only the lines of the families read here: whatever else vLLM exposes (a value or metric type
    # the parser rejects) must not make these counts unreadable.
    ours = "\n".join(line for line in text.splitlines() if COUNTED.search(line)) + "\n"
    for family in text_string_to_metric_families(ours):
        for sample in family.samples:
            if sample.name == "vllm:num_requests_running":
                counts["running"] += sample.value
            elif sample.name == "vllm:num_requests_waiting":
                counts["waiting"] += sample.value
            elif sample.name == "vllm:request_success_total":
                key = "aborted" if sample.labels.get("finished_reason") == "abort" else "finished"
                counts[key] += sample.value
    return counts


def request_counts(url: str) -> dict[str, float] | None:
    """In-flight and finished counts from vLLM's /metrics (None if unreachable or unparsable)."""
    status, body = http_get(url, "/metrics", METRICS_TIMEOUT_S)
    if status != 200:
        return None
    try:
        return parse_counts(body)
    except ValueError:
        return None


class Observer(threading.Thread):
    """Polls /health until vLLM is ready; from the drain on, polls /metrics for the exit log."""

    def __init__(self, url: str, count_requests: bool = True):
        super().__init__(name="observer", daemon=True)
        self.url = url
        # With --disable-log-stats vLLM exports no vllm:* metrics: counts would read 0, a lie.
        self.count_requests = count_requests
        self.ready = threading.Event()
        self.wake = threading.Event()  # the drain began (or the supervisor is done)
        self.stopped = threading.Event()
        self.counting = False
        # A stop while STARTING, yet vLLM answers HTTP: it became ready between two /health polls,
        # may hold accepted requests, and drains them itself (before its engine is up, its HTTP
        # server accepts nothing: a request waits in the listen queue and times out).
        self.stopped_while_starting = False
        self.answering = threading.Event()
        self.at_drain: dict[str, float] | None = None  # first sample after the drain began
        self.last: dict[str, float] | None = None
        self.last_at: float | None = None  # time.monotonic() of `last`

    def run(self) -> None:
        while not (self.ready.is_set() or self.wake.is_set()):
            if healthy(self.url):
                self.ready.set()
            else:
                self.wake.wait(TICK_S)
        self.wake.wait()
        if self.stopped_while_starting and not self.stopped.is_set():
            if http_get(self.url, "/metrics", METRICS_TIMEOUT_S)[0]:
                self.answering.set()
                self.counting = self.count_requests
        while self.counting and not self.stopped.is_set():
            counts = request_counts(self.url)
            if counts is not None:
                if self.at_drain is None:
                    self.at_drain = counts
                self.last, self.last_at = counts, time.monotonic()
            self.stopped.wait(TICK_S)

    def begin_drain(self, serving: bool) -> None:
        """Stop the health polling; count requests until the end if vLLM was serving."""
        self.counting = serving and self.count_requests
        self.stopped_while_starting = not serving
        self.wake.set()

    def stop(self) -> None:
        self.stopped.set()
        self.wake.set()

    def counts(self) -> Result | None:
        """How the drain's requests ended as the first and last /metrics samples since it began
        tell (None: never counted)."""
        first, last = self.at_drain, self.last
        if first is None or last is None:
            return None
        return Result(
            in_flight=int(first["running"] + first["waiting"]),
            finished=int(last["finished"] - first["finished"]),
            aborted=int(last["aborted"] - first["aborted"]),
            failed=0,
            open=int(last["running"] + last["waiting"]),
        )

    def summary(self, exited_at: float | None = None, counted: Result | None = None) -> str:
        """ "; N in flight at SIGTERM, ..." for the exit line, or "" if never counted.

        counted: the counts vLLM's API server wrote (run_files.Result), exact; without them,
        the /metrics samples'. exited_at: time.monotonic() when vLLM exited. The last sample can
        precede the end of the drain (one every TICK_S), so the line says how long before the
        exit it was taken."""
        if counted is not None:
            return f"; {counted.brief()} (as counted by vLLM's API server)"
        sampled = self.counts()
        if sampled is None:
            return ""
        seen = "as last seen in /metrics"
        if exited_at is not None and self.last_at is not None:
            seen += f", {max(exited_at - self.last_at, 0):.1f} s before vLLM exited"
        return f"; {sampled.brief()} ({seen}; no count from vLLM's API server)"
