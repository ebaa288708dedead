"""Readiness and liveness: one decision, asked two ways.

`entrypoint.py probe ready|live` (exec probes, compose healthcheck) reads the state file the loop
publishes; with INTEL_VLLM_PROBE_PORT set, the supervisor also answers `GET /ready` and
`GET /live` itself (HTTP probes: no Python interpreter started per probe).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import pathlib
import selectors
import socket
import stat
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable

from . import paths, settings
from .errors import ConfigError, load_json, shown
from .log import log
from .observe import healthy
from .state import State

KINDS = ("ready", "live")
PROBE_TIMEOUT_S = 2.0  # how long a probe waits for vLLM's /health
STATES = frozenset(s.value for s in State)


def decide(kind: str, state: str, vllm_healthy: bool) -> bool:
    """ready: serving and /health answers (fails the moment a drain starts); live: still loading,
    or the server answers (holds while draining)."""
    if kind == "ready":
        return state == State.SERVING.value and vllm_healthy
    return state == State.STARTING.value or (
        state in (State.SERVING.value, State.DRAINING.value) and vllm_healthy
    )


def read_state(path: pathlib.Path) -> bytes:
    """The state file's bytes; OSError if there is none. Not a FIFO or a device planted there
    (which could block the probe), and no more than a state file ever holds."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def parse_state(raw: bytes) -> dict:
    """What `Supervisor.write_state` wrote, checked: the probe signals its pid and asks its url,
    so a file anyone else wrote must not make it signal a process group or ask another host.
    Raises ValueError saying what is wrong."""
    try:
        data = load_json(raw)
    except ValueError as e:  # UnicodeDecodeError included
        raise ValueError("not JSON" if "nested" not in str(e) else f"JSON {e}") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    pid = data.get("pid")
    # bool is an int; 0 and -1 would make kill(2) signal a group or every process
    if type(pid) is not int or not 0 < pid < 2**31:
        raise ValueError(f"pid {pid!r} is not a process id")
    if data.get("state") not in STATES:
        raise ValueError(f"unknown state {data.get('state')!r}")
    url = data.get("url")
    if url:
        why = url_problem(url)
        if why:
            raise ValueError(why)
    return data


def url_problem(url) -> str | None:
    """Why `url` is not one the supervisor would ask vLLM on (http(s) on this host), or None.
    Printable ASCII without blanks only: http.client raises InvalidURL on a control character."""
    if not isinstance(url, str) or not url.isascii() or not url.isprintable() or " " in url:
        return f"url {shown(url)} is not a URL"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError on a bad port)
    except (TypeError, ValueError, AttributeError):
        return f"url {url!r} is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"url {url!r} is not an http(s) URL"
    if not is_local_host(parts.hostname):
        return f"url {url!r} is not on this host (loopback or an address of this host only)"
    return None


def is_local_host(host: str) -> bool:
    """Loopback, or an address of this host (vLLM's own --host): one a socket can bind."""
    if host.lower() == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name would need a DNS look-up, whose answer anyone may control
    if addr.is_loopback:
        return True
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
        return True
    except OSError:
        return False


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def probe(args: list[str], env=os.environ) -> int:
    """`entrypoint.py probe ready|live [--port N]`: exit 0 or 1."""
    if not args or args[0] not in KINDS:
        raise ConfigError("probe takes `ready` or `live`")
    port_s = settings.flag_value(args[1:], "--port")
    if port_s is not None:
        port = settings.parse_port("--port", port_s)
    else:
        port = settings.parse_port(
            "INTEL_VLLM_PORT", env.get("INTEL_VLLM_PORT", str(settings.DEFAULT_PORT))
        )
    path = paths.state_file(port, env)
    if path.parent == paths.private_dir() and not paths.is_private_dir(path.parent):
        print(
            f"not {args[0]}: {path.parent} is not this user's private directory (another "
            "user's, a symlink, or group/other may write it): its state file is not read",
            file=sys.stderr,
        )
        return 1
    try:
        data = parse_state(read_state(path))
    except OSError:
        data = None
    except ValueError as e:  # not what a supervisor writes: say so, and ask nobody
        print(f"not {args[0]}: state file {path}: {e}", file=sys.stderr)
        return 1
    if data is None or not process_exists(data["pid"]):
        print(f"not {args[0]}: no running supervisor for port {port}")
        return 1
    state = data["state"]
    ok_health = healthy(data.get("url") or f"http://127.0.0.1:{port}", PROBE_TIMEOUT_S)
    ok = decide(args[0], state, ok_health)
    print(
        f"{'' if ok else 'not '}{args[0]}: state {state}, "
        f"/health {'ok' if ok_health else 'failing'}"
    )
    return 0 if ok else 1


# -- the probe port ----------------------------------------------------------------------
# One thread serves the port: a selector reads requests (an idle or slow connection costs a
# socket, never a thread) and each complete one is answered at once. A connection that has not
# sent its request within CONN_TIMEOUT_S is closed; past MAX_PENDING open connections the oldest
# goes (a probe sends its request at once, so the oldest are the idle ones). vLLM's /health is
# asked at most once per HEALTH_CACHE_S whatever the number of probes: the answers in between
# (several kubelets, a probe storm) reuse it, so a slow vLLM delays the port by at most one
# PROBE_TIMEOUT_S per HEALTH_CACHE_S, never by one per probe.
HEALTH_CACHE_S = 1.0
MAX_PENDING = 128
CONN_TIMEOUT_S = 5.0
MAX_REQUEST = 8192  # request line and headers
BACKLOG = 128
ACCEPT_BACKOFF_S = 0.1  # out of fds (EMFILE): stop accepting this long, not spin on accept()
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    501: "Not Implemented",
    503: "Service Unavailable",
}


def listen(port: int, host_v6: str = "::", host_v4: str = "0.0.0.0") -> socket.socket:
    """A listening socket on `port`: dual-stack `::` (IPV6_V6ONLY off: IPv4 reaches it as
    ::ffff:a.b.c.d), else `0.0.0.0` where the host has no IPv6. Any other error (the port in use,
    no permission, a port out of range: OSError, which cli.py reports in one line) is raised."""
    if type(port) is not int or not 0 <= port < 65536:  # bind would raise OverflowError
        raise OSError(errno.EINVAL, f"port must be 0-65535, not {port!r}")
    if socket.has_ipv6:
        sock = None
        try:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            return _bind(sock, (host_v6, port))
        except OSError as e:
            if sock is not None:
                sock.close()
            if e.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT):
                raise
    return _bind(socket.socket(socket.AF_INET, socket.SOCK_STREAM), (host_v4, port))


def _bind(sock: socket.socket, addr) -> socket.socket:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server does
        sock.bind(addr)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def response(status: int, body: bytes, content_type: str = "text/plain") -> bytes:
    head = (
        f"HTTP/1.0 {status} {REASONS[status]}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def request_kind(raw: bytes) -> tuple[int, str | None]:
    """(0, kind) for `GET /ready`, `/live` or `/metrics`, else (the error status, None)."""
    words = raw.split(b"\n", 1)[0].split()
    if len(words) != 3 or not words[2].startswith(b"HTTP/"):
        return 400, None
    if words[0] != b"GET":
        return 501, None
    kind = words[1].decode("latin-1").split("?")[0].strip("/")
    return (0, kind) if kind in (*KINDS, "metrics") else (404, None)


class ProbeServer:
    """GET /ready and /live on a port, from one daemon thread (see above)."""

    def __init__(
        self,
        port: int,
        answer: Callable[[str], tuple[bool, str]],
        metrics: Callable[[], bytes] | None = None,
    ):
        self.answer = answer  # kind -> (ok, body line)
        self.metrics = metrics  # the Prometheus exposition, or None: /metrics is 404
        self.socket = listen(port)
        self.server_address = self.socket.getsockname()
        self._pending: dict[socket.socket, tuple[float, bytearray]] = {}  # oldest first
        self._stop = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.socket, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._threads = [threading.Thread(target=self._read_loop, name="probes", daemon=True)]
        self._resume_at: float | None = None  # accepting again then (after EMFILE)

    def start(self) -> ProbeServer:
        for t in self._threads:
            t.start()
        return self

    def shutdown(self) -> None:
        self._stop.set()
        self._wake_w.send(b"x")
        for t in self._threads:
            t.join(5)

    def server_close(self) -> None:
        for sock in list(self._pending):
            self._drop(sock)
        for sock in (self.socket, self._wake_r, self._wake_w):
            sock.close()
        self._sel.close()

    # -- the reader ----------------------------------------------------------------------
    def _read_loop(self) -> None:
        while not self._stop.is_set():
            timeout = CONN_TIMEOUT_S
            if self._pending:
                oldest = next(iter(self._pending.values()))[0]
                timeout = max(oldest - time.monotonic(), 0.0)
            if self._resume_at is not None:
                left = self._resume_at - time.monotonic()
                if left <= 0:
                    self._resume_at = None
                    self._sel.register(self.socket, selectors.EVENT_READ, "listen")
                else:
                    timeout = min(timeout, left)
            for key, _ in self._sel.select(timeout):
                if key.data == "listen":
                    self._accept()
                elif key.data == "wake":
                    return
                else:
                    self._read(key.fileobj)
            now = time.monotonic()
            while self._pending:  # insertion order is deadline order
                sock, (deadline, _) = next(iter(self._pending.items()))
                if deadline > now:
                    break
                self._drop(sock)

    def _accept(self) -> None:
        for _ in range(BACKLOG):
            try:
                conn, _addr = self.socket.accept()
            except (BlockingIOError, InterruptedError, ConnectionError):
                return
            except OSError as e:  # EMFILE and the like: the connection waits in the backlog
                log_once(f"probe port: cannot accept: {e}")
                # The listening socket stays readable: stop watching it for a while (an fd may
                # free meanwhile), or select() returns at once and the thread spins a core.
                self._sel.unregister(self.socket)
                self._resume_at = time.monotonic() + ACCEPT_BACKOFF_S
                return
            if len(self._pending) >= MAX_PENDING:
                self._drop(next(iter(self._pending)))
            conn.setblocking(False)
            self._pending[conn] = (time.monotonic() + CONN_TIMEOUT_S, bytearray())
            self._sel.register(conn, selectors.EVENT_READ, "conn")

    def _read(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset by the client: nothing to answer, nothing to say
            data = b""
        if not data:
            self._drop(sock)
            return
        buf = self._pending[sock][1]
        buf += data
        if b"\r\n\r\n" not in buf and b"\n\n" not in buf:
            if len(buf) > MAX_REQUEST:
                self._drop(sock)
            return
        self._sel.unregister(sock)
        del self._pending[sock]
        self._respond(sock, bytes(buf))

    def _drop(self, sock: socket.socket) -> None:
        self._pending.pop(sock, None)
        try:
            self._sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()

    # -- the answers ---------------------------------------------------------------------
    def _respond(self, sock: socket.socket, raw: bytes) -> None:
        try:
            self._answer(sock, raw)
        except OSError:  # the client reset or went away: nothing to say
            pass
        except Exception as e:  # noqa: BLE001 (a bug: one line, and the port keeps answering)
            log_once(f"probe port: {type(e).__name__}: {e}")
        finally:
            sock.close()

    def _answer(self, sock: socket.socket, raw: bytes) -> None:
        status, kind = request_kind(raw)
        content_type = "text/plain"
        if kind == "metrics" and self.metrics is not None:
            from .metrics import CONTENT_TYPE

            status, body, content_type = 200, self.metrics(), CONTENT_TYPE
        elif kind in KINDS:
            ok, line = self.answer(kind)
            status, body = (200 if ok else 503), f"{line}\n".encode()
        else:
            status = status or 404
            body = f"{status} {REASONS[status]}\n".encode()
        sock.settimeout(CONN_TIMEOUT_S)
        sock.sendall(response(status, body, content_type))


_logged: set[str] = set()


def log_once(msg: str) -> None:
    if msg not in _logged:
        _logged.add(msg)
        log(msg)


def serve_http(
    probe_port: int,
    vllm_url: str,
    state: Callable[[], State],
    metrics: Callable[[], bytes] | None = None,
) -> ProbeServer:
    """Answer GET /ready, /live (and /metrics: `metrics()`) on probe_port from one daemon
    thread; returns the server. Raises OSError when the port cannot be bound."""
    health = CachedHealth(vllm_url)

    def answer(kind: str) -> tuple[bool, str]:
        current = state().value
        # Ask vLLM only when the answer depends on it (never once readiness is lost).
        ok = decide(kind, current, False) or (decide(kind, current, True) and health())
        return ok, f"{'' if ok else 'not '}{kind}: state {current}"

    return ProbeServer(probe_port, answer, metrics).start()


class CachedHealth:
    """vLLM's /health, asked again only when the last answer is older than HEALTH_CACHE_S."""

    def __init__(self, url: str, clock: Callable[[], float] = time.monotonic):
        self.url, self.clock = url, clock
        self.ok, self.at = False, None

    def __call__(self) -> bool:
        now = self.clock()
        if self.at is None or now - self.at >= HEALTH_CACHE_S:
            self.ok = healthy(self.url, PROBE_TIMEOUT_S)
            self.at = self.clock()  # after the call: a slow answer is not stale at once
        return self.ok
