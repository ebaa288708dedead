"""The supervisor's probe port (probes.serve_http): dual-stack, bounded in threads however many
connections sit idle on it, idle connections timed out, quiet about clients that reset; and
`entrypoint.py probe` (probe_client.py) on a bad port: one line, exit 64."""

from __future__ import annotations

import contextlib
import errno
import http.client
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from tests.harness import ROOT, free_port
from vllm_intel.supervisor import probe_client, probes, settings
from vllm_intel.supervisor.errors import ConfigError
from vllm_intel.supervisor.state import State

NOWHERE = "http://127.0.0.1:9"  # no vLLM: STARTING answers without asking it


@contextlib.contextmanager
def server(state=State.STARTING):
    port = free_port()
    srv = probes.serve_http(port, NOWHERE, lambda: state)
    try:
        yield port
    finally:
        srv.shutdown()
        srv.server_close()


def get(port: int, path: str, host: str = "127.0.0.1", timeout: float = 1.0) -> tuple[int, str]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        res = conn.getresponse()
        return res.status, res.read().decode()
    finally:
        conn.close()


def has_ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def reset(sock: socket.socket) -> None:
    """Close with an RST, not a FIN (SO_LINGER on, time 0)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_answers_ready_and_live():
    with server() as port:
        assert get(port, "/ready") == (503, "not ready: state STARTING\n")
        assert get(port, "/live") == (200, "live: state STARTING\n")
        assert get(port, "/live?x=1")[0] == 200
        assert get(port, "/nothing")[0] == 404


def test_a_thousand_idle_connections_cost_no_threads_and_do_not_block_ready():
    """A thread-per-connection server (http.server's ThreadingHTTPServer) would hold a thread
    per idle connection: 1000 of them, 1000 threads. Here they cost a socket (the oldest closed
    past a bound), and a probe arriving among them is answered at once."""
    before = threading.active_count()
    with server() as port:
        idle = []
        try:
            for _ in range(1000):
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            time.sleep(0.3)  # let a thread-per-connection server start its threads
            threads = threading.active_count()
            assert threads < before + 20, threads
            t = time.monotonic()
            assert get(port, "/ready")[0] == 503
            assert time.monotonic() - t < 1.0
            # Half a request (slow clients) ties up no worker either.
            for s in idle[-10:]:
                s.sendall(b"GET /ready HTTP/1.0\r\n")
            t = time.monotonic()
            assert get(port, "/live")[0] == 200
            assert time.monotonic() - t < 1.0
            assert threading.active_count() < before + 20
        finally:
            for s in idle:
                s.close()


def test_past_the_bound_the_oldest_idle_connection_goes_and_a_huge_request_is_dropped(
    monkeypatch,
):
    monkeypatch.setattr(probes, "MAX_PENDING", 4)
    with server() as port:
        idle = [socket.create_connection(("127.0.0.1", port), timeout=3) for _ in range(4)]
        try:
            time.sleep(0.2)  # all four accepted
            newest = socket.create_connection(("127.0.0.1", port), timeout=3)
            assert idle[0].recv(100) == b""  # the oldest, closed by the server
            newest.sendall(b"GET /live HTTP/1.0\r\n\r\n")
            assert newest.recv(100).startswith(b"HTTP/1.0 200")
            newest.close()
            with socket.create_connection(("127.0.0.1", port), timeout=3) as huge:
                huge.sendall(b"GET /live HTTP/1.0\r\n" + b"X-A: b\r\n" * 2000)
                try:  # no answer past MAX_REQUEST bytes: closed (a reset if unread data was left)
                    assert huge.recv(100) == b""
                except ConnectionResetError:
                    pass
        finally:
            for s in idle:
                s.close()


def test_an_idle_connection_is_closed_after_the_timeout(monkeypatch):
    monkeypatch.setattr(probes, "CONN_TIMEOUT_S", 0.3)
    with server() as port:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            t = time.monotonic()
            assert s.recv(100) == b""  # closed by the server (a socket.timeout would fail)
            assert time.monotonic() - t < 2.0


def test_ready_is_reachable_over_ipv4_and_ipv6():
    with server() as port:
        assert get(port, "/live", "127.0.0.1")[0] == 200
        if not has_ipv6_loopback():
            pytest.skip("this machine has no IPv6 loopback (::1 cannot be bound)")
        assert get(port, "/live", "::1")[0] == 200
        assert get(port, "/ready", "::1")[0] == 503


def test_without_ipv6_it_listens_on_ipv4(monkeypatch):
    monkeypatch.setattr(socket, "has_ipv6", False)
    sock = probes.listen(0)
    with sock:
        assert sock.family == socket.AF_INET and sock.getsockname()[0] == "0.0.0.0"


@pytest.mark.parametrize("err", [errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL])
def test_when_ipv6_cannot_be_bound_it_listens_on_ipv4(monkeypatch, err):
    real = socket.socket

    def fake(family=socket.AF_INET, *args, **kwargs):
        if family == socket.AF_INET6:
            raise OSError(err, "no IPv6 here")
        return real(family, *args, **kwargs)

    monkeypatch.setattr(socket, "socket", fake)
    sock = probes.listen(0)
    monkeypatch.undo()
    with sock:
        assert sock.family == socket.AF_INET


def test_a_port_in_use_is_an_error():
    with socket.socket(socket.AF_INET6 if has_ipv6_loopback() else socket.AF_INET) as other:
        other.bind(("", 0))
        other.listen()
        with pytest.raises(OSError):
            probes.listen(other.getsockname()[1])


@pytest.mark.parametrize("port", [65536, 99999, -1])
def test_a_port_out_of_range_is_an_oserror(port):
    """cli.py turns an OSError from serve_http into one line and exit 64; bind's own
    OverflowError would be a traceback."""
    with pytest.raises(OSError, match="0-65535"):
        probes.serve_http(port, NOWHERE, lambda: State.STARTING)


def test_a_client_that_resets_leaves_no_traceback(capfd):
    with server() as port:
        half = socket.create_connection(("127.0.0.1", port), timeout=2)
        half.sendall(b"GET /rea")
        time.sleep(0.2)  # the server is reading it
        reset(half)
        whole = socket.create_connection(("127.0.0.1", port), timeout=2)
        whole.sendall(b"GET /live HTTP/1.0\r\n\r\n")
        reset(whole)  # before the answer is read
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.sendall(b"GET /ready HTTP/1.0\r\n\r\n")
            reset(s)
        time.sleep(0.5)
        assert get(port, "/live")[0] == 200  # still answering
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    assert "Error" not in err, err


@pytest.mark.parametrize(
    "args,env",
    [
        ([], {"INTEL_VLLM_PORT": "abc"}),
        ([], {"INTEL_VLLM_PORT": "99999"}),
        ([], {"INTEL_VLLM_PORT": "0"}),
        ([], {"INTEL_VLLM_PORT": "-1"}),
        ([], {"INTEL_VLLM_PORT": ""}),
        (["--port", "abc"], {}),
        (["--port=70000"], {}),
    ],
)
def test_probe_with_a_bad_port_is_a_config_error(args, env):
    with pytest.raises(ConfigError, match="port number"):
        probe_client.probe(["ready", *args], env)
    run = subprocess.run(
        [sys.executable, str(ROOT / "entrypoint.py"), "probe", "ready", *args],
        env={"PATH": "/usr/bin:/bin", "INTEL_VLLM_STATE_FILE": "/nonexistent", **env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 64, run
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_parse_port():
    assert settings.parse_port("p", "8000") == 8000
    assert settings.parse_port("p", " 65535 ") == 65535
    for bad in ("65536", "0", "8e3", "", None, "١٢٣"):
        with pytest.raises(ConfigError):
            settings.parse_port("p", bad)


@pytest.mark.parametrize("probe_port", ["99999", "0", "abc", "²", "١٢٣"])
def test_a_bad_probe_port_in_the_env_is_no_traceback(probe_port):
    """entrypoint.py probe asks the probe port only when INTEL_VLLM_PROBE_PORT is a port; a set
    value that is none is a configuration error: one line, exit 64 (not "not ready")."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "entrypoint.py"), "probe", "ready"],
        env={
            "PATH": "/usr/bin:/bin",
            "INTEL_VLLM_STATE_FILE": "/nonexistent",
            "INTEL_VLLM_PROBE_PORT": probe_port,
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 64 and "Traceback" not in run.stderr, run
    assert run.stderr.startswith("entrypoint.py: INTEL_VLLM_PROBE_PORT must be a port number")
    assert run.stderr.count("\n") == 1, run.stderr
