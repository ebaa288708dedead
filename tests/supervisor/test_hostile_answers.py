"""What vLLM's HTTP server can answer, against everything that asks it: a cut, slow, malformed or
huge answer (a hostile server on 127.0.0.1, one behaviour per case) must leave the observer thread
alive, the probe port answering within PROBE_TIMEOUT_S, and `entrypoint.py probe` printing one
line; every call within its deadline, never an exception."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.harness import ROOT, free_port
from vllm_intel.supervisor import observe, probes
from vllm_intel.supervisor.state import State

from .test_probe_server import get as probe_server_get

SLACK = 3.0  # scheduling on a busy 2-core host; a per-operation timeout would take minutes
TRICKLE_S = 0.2  # a byte at a time, well under any per-operation timeout


def send(data: bytes):
    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(data)

    return answer


def trickle(head: bytes, rest: bytes):
    """`head` at once, then `rest` one byte every TRICKLE_S."""

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head)
        for i in range(len(rest)):
            if stop.wait(TRICKLE_S):
                return
            conn.sendall(rest[i : i + 1])

    return answer


def never(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait()


def huge(conn: socket.socket, stop: threading.Event) -> None:
    """A whole 200 whose body is 64 MiB."""
    size = 64 << 20
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
    block = b"x" * (1 << 20)
    for _ in range(size // len(block)):
        conn.sendall(block)


OK = send(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
CASES = {
    "cut body": send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc"),
    "bad status line": send(b"HTTP/1.1 abc OK\r\nContent-Length: 0\r\n\r\n"),
    "header over 64 KiB": send(b"HTTP/1.1 200 OK\r\nX-A: " + b"a" * (65 << 10) + b"\r\n\r\n"),
    "200 headers": send(b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 200 + b"\r\n"),
    "trickled headers": trickle(b"HTTP/1.1 200 OK\r\n", b"X-A: " + b"b" * 1000 + b"\r\n\r\n"),
    "trickled body": trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", b"x" * 1000),
    "never answers": never,
    "closes at once": send(b""),
    "garbage bytes": send(bytes(range(256)) * 4),
    "chunked body cut mid-chunk": send(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc"
    ),
    "huge body": huge,
}
IDS = list(CASES)
# Those that last until the deadline: their bound is http_get's (a) and the probe port's (c); the
# observer (b) and the exec probe (d) get what http_get returns, so the quick ones show them
# surviving every kind of failed answer.
TIMED_OUT = ("trickled headers", "trickled body", "never answers")
QUICK = [c for c in IDS if c not in TIMED_OUT]


class Hostile:
    """An HTTP server on 127.0.0.1 answering its n-th connection with answers[n] (the last one
    from then on), each connection on a thread of its own; `ok_sent` is set once it began
    sending OK."""

    def __init__(self, *answers, tls: ssl.SSLContext | None = None):
        self.answers, self.tls = list(answers), tls
        self.stop, self.ok_sent = threading.Event(), threading.Event()
        self.conns: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
            threading.Thread(target=self._serve, args=(conn, answer), daemon=True).start()

    def _serve(self, conn: socket.socket, answer) -> None:
        try:
            conn.settimeout(30)
            if self.tls:
                conn = self.tls.wrap_socket(conn, server_side=True)
                self.conns.append(conn)
            request = b""
            while b"\r\n\r\n" not in request and (data := conn.recv(4096)):
                request += data
            if answer is OK:
                self.ok_sent.set()
            answer(conn, self.stop)
        except OSError:
            pass  # the client gave up: what the hostile answers are for
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


@contextlib.contextmanager
def hostile(*answers, tls: ssl.SSLContext | None = None):
    server = Hostile(*answers, tls=tls)
    try:
        yield server
    finally:
        server.close()


def wait_for(condition, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.02)


def timed(call, *args):
    t = time.monotonic()
    return call(*args), time.monotonic() - t


# -- (a) http_get, healthy, request_counts ------------------------------------------------------


@pytest.mark.parametrize("case", IDS)
def test_http_get_returns_within_its_deadline_and_never_raises(case):
    with hostile(CASES[case]) as server:
        (status, why), took = timed(observe.http_get, server.url, "/health", 1.0)
        assert status == 0 and why, why
        assert took < 1.0 + SLACK, (took, why)
        ok, took = timed(observe.healthy, server.url, 1.0)
        assert ok is False and took < 1.0 + SLACK, took
        counts, took = timed(observe.request_counts, server.url)
        assert counts is None and took < observe.METRICS_TIMEOUT_S + SLACK, (counts, took)


def test_a_whole_answer_is_read_and_parsed():
    metrics = b"vllm:num_requests_running 2\nvllm:num_requests_waiting 1\n"
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunked += b"%x\r\n%s\r\n0\r\n\r\n" % (len(metrics), metrics)
    to_eof = b"HTTP/1.0 200 OK\r\n\r\nno length: the body ends at the close"
    with hostile(send(chunked), OK, send(to_eof), send(b"HTTP/1.1 503 No\r\n\r\n")) as server:
        assert observe.request_counts(server.url) == {
            "running": 2.0,
            "waiting": 1.0,
            "finished": 0.0,
            "aborted": 0.0,
        }
        assert observe.healthy(server.url)
        assert observe.http_get(server.url, "/", 5) == (200, to_eof.split(b"\r\n\r\n")[1].decode())
        assert observe.http_get(server.url, "/", 5) == (503, "")


def test_a_whole_answer_from_a_server_that_keeps_the_connection_open_is_read():
    """Content-Length says where it ends: the deadline ends the read, not the answer."""
    keeps_open = trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"\0" * 100)
    with hostile(keeps_open) as server:
        assert observe.http_get(server.url, "/health", 0.5) == (200, "ok")


PIECES = [b"HTTP/1.1 ", b"HTTP/1.0 ", b"200", b"100", b"204", b" OK", b"\r\n", b"\n", b": ", b"5"]
PIECES += [b"\r\n\r\n", b"Content-Length: ", b"-1", b"Transfer-Encoding: chunked", b"ff", b";x"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(PIECES) | st.binary(max_size=8), max_size=30),
    st.sampled_from([None, TimeoutError("timed out"), ConnectionResetError()]),
)
def test_the_parser_never_raises_whatever_the_bytes(pieces, stopped):
    status, text = observe.parse_answer(b"".join(pieces), 1 << 16, stopped)
    assert isinstance(status, int) and isinstance(text, str)
    assert status or text


def test_a_bad_url_is_an_answer_of_zero():
    for url in ("ftp://127.0.0.1:1", "http://", "http://127.0.0.1:99999", "http://[::1"):
        assert observe.http_get(url, "/health", 0.5)[0] == 0


# -- (b) the observer thread --------------------------------------------------------------------


@pytest.mark.parametrize("case", QUICK)
def test_the_observer_survives_and_sees_vllm_turn_healthy(case):
    with hostile(CASES[case], CASES[case], OK) as server:
        obs = observe.Observer(server.url)
        obs.start()
        try:
            end = time.monotonic() + 60
            while not obs.ready.is_set() and obs.is_alive() and time.monotonic() < end:
                time.sleep(0.05)
            assert obs.is_alive(), "the observer thread died"
            assert obs.ready.is_set(), "not ready in 60 s"
            assert server.ok_sent.is_set(), "ready on a malformed answer"
        finally:
            obs.stop()
            obs.join(10)


# -- (c) the probe port ---------------------------------------------------------------------------


def get(port: int, path: str) -> tuple[int, str]:
    return probe_server_get(port, path, timeout=60)


@contextlib.contextmanager
def probe_port(url: str, state: list[State]):
    port = free_port()
    srv = probes.serve_http(port, url, lambda: state[0], lambda: b"# metrics\n")
    try:
        yield port
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("case", IDS)
def test_the_probe_port_answers_in_time_whatever_health_answers(case, monkeypatch):
    """/ready waits for the health check at most PROBE_TIMEOUT_S; meanwhile the port's loop answers
    what does not need /health (/metrics; /live while STARTING) at once."""
    monkeypatch.setattr(probes, "PROBE_TIMEOUT_S", 6.0)  # far above the 3 s of "at once"
    state = [State.SERVING]
    with hostile(CASES[case]) as server, probe_port(server.url, state) as port:
        ready: list = []
        waiter = threading.Thread(target=lambda: ready.append(timed(get, port, "/ready")))
        waiter.start()
        wait_for(lambda: server.conns)  # the check is in flight
        assert timed(get, port, "/metrics")[1] < 3
        state[0] = State.STARTING
        (status, _), took = timed(get, port, "/live")
        assert status == 200 and took < 3, took
        waiter.join(60)
        (status, body), took = ready[0]
        assert status == 503 and took < probes.PROBE_TIMEOUT_S + SLACK, (body, took)


def test_one_health_check_serves_every_probe_waiting_for_it(monkeypatch):
    monkeypatch.setattr(probes, "PROBE_TIMEOUT_S", 1.0)
    with hostile(never) as server, probe_port(server.url, [State.SERVING]) as port:
        results: list = []
        waiters = [
            threading.Thread(target=lambda: results.append(get(port, "/ready"))) for _ in range(10)
        ]
        for w in waiters:
            w.start()
        for w in waiters:
            w.join(60)
        assert [status for status, _ in results] == [503] * 10
        assert len(server.conns) == 1  # one /health asked for the ten probes


def test_the_probe_port_resolves_a_name_on_no_thread():
    """A name (vLLM's --host localhost) is resolved once, up front: asyncio would resolve it on an
    executor thread of PID 1's, on every check."""
    with hostile(OK) as server:
        url = f"http://localhost:{server.port}"
        with probe_port(url, [State.SERVING]) as port:
            assert get(port, "/ready")[0] == 200
            assert not [t.name for t in threading.enumerate() if t.name.startswith("asyncio")]


def test_pid_1_runs_three_threads_while_the_probe_port_asks_vllm_by_name(run, tmp_path):
    """The loop, the observer and the probe port: no executor thread to resolve vLLM's --host
    `localhost`, none per health check."""
    probe, port = free_port(), free_port()
    model = tmp_path / "model"
    r = run(
        {"INTEL_VLLM_PROBE_PORT": str(probe)},
        ["serve", str(model), "--port", str(port), "--host", "localhost"],
    )
    r.wait_for(lambda: r.state() == "SERVING")
    for _ in range(3):
        assert get(probe, "/ready") == (200, "ready: state SERVING\n")
        assert get(probe, "/live")[0] == 200
        time.sleep(probes.HEALTH_CACHE_S)  # the next probe asks vLLM again
    assert len(os.listdir(f"/proc/{r.proc.pid}/task")) == 3
    r.signal(signal.SIGTERM)
    code, out, _ = r.finish()
    assert code == 0, out


@pytest.fixture(scope="module")
def tls_server_context(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.skip("no openssl to make a certificate")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(d / "k.pem"), "-out", str(d / "c.pem"), "-subj", "/CN=example.org"],
        check=True,
        capture_output=True,
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(d / "c.pem", d / "k.pem")
    return ctx


def test_https_is_asked_without_verification_and_bounded_too(tls_server_context, monkeypatch):
    monkeypatch.setattr(probes, "PROBE_TIMEOUT_S", 1.0)
    slow = CASES["trickled body"]
    with hostile(OK, slow, OK, slow, tls=tls_server_context) as server:
        assert observe.http_get(server.url, "/health", 5) == (200, "")
        assert timed(observe.http_get, server.url, "/health", 1.0)[1] < 1.0 + SLACK
        with probe_port(server.url, [State.SERVING]) as port:
            assert get(port, "/ready")[0] == 200
            time.sleep(probes.HEALTH_CACHE_S)  # the next probe asks again
            (status, _), took = timed(get, port, "/ready")
            assert status == 503 and took < 1.0 + SLACK, took


# -- (d) the exec probe ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", QUICK)
def test_the_exec_probe_prints_one_line_and_fails(case, tmp_path):
    with hostile(CASES[case]) as server:
        state = tmp_path / "state.json"
        state.write_text(json.dumps({"state": "SERVING", "pid": os.getpid(), "url": server.url}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("INTEL_VLLM_")}
        t = time.monotonic()
        run = subprocess.run(
            [sys.executable, str(ROOT / "entrypoint.py"), "probe", "ready", "--port", "8000"],
            env={**env, "INTEL_VLLM_STATE_FILE": str(state)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - t
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "Traceback" not in out and out.count("\n") == 1, out
    assert out.startswith("not ready: state SERVING, /health failing"), out
    assert took < probes.PROBE_TIMEOUT_S + 10, took  # 10: a Python interpreter's start
