"""Readiness and liveness: one decision, asked two ways.

With INTEL_VLLM_PROBE_PORT set, the supervisor answers `GET /ready` and `GET /live` (and its
`/metrics`) itself: HTTP probes start no Python interpreter. `entrypoint.py probe ready|live`
(exec probes, compose healthcheck; probe_client.py) reads the state file the loop publishes.

The port is served by the standard library's asyncio streams on one daemon thread: an idle or
slow connection costs a socket, never a thread. Invariants:
- a connection that has not sent its whole request within CONN_TIMEOUT_S is closed, a request over
  MAX_REQUEST bytes too, and past MAX_PENDING open connections the oldest goes (a probe sends its
  request at once: the oldest are the idle ones);
- out of file descriptors, asyncio stops accepting for a while instead of spinning on accept()
  (the connection waits in the backlog), and the port says so once;
- vLLM's /health is asked from the port's own loop, never blocking it: one check in flight for all
  probes, at most one per HEALTH_CACHE_S, the whole check (connect, request, answer) bounded by
  PROBE_TIMEOUT_S and its answer by HEALTH_MAX bytes, so a slow, cut or malformed /health answer
  delays a probe that needs it (`/ready`, `/live` once serving) by at most PROBE_TIMEOUT_S and the
  others (`/live` while starting, `/metrics`) not at all.
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import select
import socket
import threading
import time
from collections.abc import Awaitable, Callable

from .log import log
from .observe import HEALTH_MAX, parse_answer, request, target, tls_context
from .state import State

KINDS = ("ready", "live")
PROBE_TIMEOUT_S = 2.0  # how long a probe waits for vLLM's /health
HEALTH_CACHE_S = 1.0
MAX_PENDING = 128
CONN_TIMEOUT_S = 5.0
MAX_REQUEST = 8192  # request line and headers
BACKLOG = 128
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    501: "Not Implemented",
    503: "Service Unavailable",
}


def decide(kind: str, state: str, vllm_healthy: bool) -> bool:
    """ready: serving and /health answers (fails the moment a drain starts); live: still loading,
    or the server answers (holds while draining)."""
    if kind == "ready":
        return state == State.SERVING.value and vllm_healthy
    return state == State.STARTING.value or (
        state in (State.SERVING.value, State.DRAINING.value) and vllm_healthy
    )


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


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """The request line and headers, up to the blank line. ValueError if the client closed first
    or sent more than MAX_REQUEST bytes (readline raises it on a line over the reader's limit)."""
    raw = b""
    while (line := await reader.readline()) not in (b"\r\n", b"\n"):
        if not line.endswith(b"\n") or len(raw) + len(line) > MAX_REQUEST:
            raise ValueError("no whole request")
        raw += line
    return raw


class ProbeServer:
    """GET /ready and /live (and /metrics) on a port, from one daemon thread (see above)."""

    def __init__(
        self,
        port: int,
        answer: Callable[[str], tuple[bool, str] | Awaitable[tuple[bool, str]]],
        metrics: Callable[[], bytes] | None = None,
    ):
        self.answer = answer  # kind -> (ok, body line), or a coroutine of it run in the port's loop
        self.metrics = metrics  # the Prometheus exposition, or None: /metrics is 404
        self.socket = listen(port)
        self.server_address = self.socket.getsockname()
        self._open: dict[asyncio.StreamWriter, None] = {}  # oldest first
        self._stop = asyncio.Event()
        try:
            self._loop = new_loop()
        except OSError:
            self.socket.close()
            raise
        self._loop.set_exception_handler(self._on_loop_error)
        self._thread = threading.Thread(target=self._run, name="probes", daemon=True)

    def start(self) -> ProbeServer:
        self._thread.start()
        return self

    def shutdown(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)

    def server_close(self) -> None:
        if not self._thread.is_alive():
            self._loop.close()
        self.socket.close()

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        server = await asyncio.start_server(
            self._connection, sock=self.socket, limit=MAX_REQUEST, backlog=BACKLOG
        )
        await self._stop.wait()
        server.close()
        for writer in list(self._open):
            writer.transport.abort()
        others = asyncio.all_tasks() - {asyncio.current_task()}  # probes, a /health check
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        await server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        if len(self._open) >= MAX_PENDING:
            next(iter(self._open)).transport.abort()  # its own handler forgets it
        self._open[writer] = None
        try:
            raw = await asyncio.wait_for(read_request(reader), CONN_TIMEOUT_S)
            writer.write(await self.respond(raw))
            await asyncio.wait_for(writer.drain(), CONN_TIMEOUT_S)
        except (OSError, ValueError, asyncio.TimeoutError, asyncio.CancelledError):
            pass  # idle, too long, reset by the client, or the port stops: closed, nothing to say
        except Exception as e:  # noqa: BLE001 (a bug: one line, and the port keeps answering)
            log_once(f"probe port: {type(e).__name__}: {e}")
        finally:
            del self._open[writer]
            writer.close()

    async def respond(self, raw: bytes) -> bytes:
        status, kind = request_kind(raw)
        if kind == "metrics" and self.metrics is not None:
            from .metrics import CONTENT_TYPE

            return response(200, self.metrics(), CONTENT_TYPE)
        if kind in KINDS:
            answer = self.answer(kind)
            ok, line = await answer if inspect.isawaitable(answer) else answer
            return response(200 if ok else 503, f"{line}\n".encode())
        status = status or 404
        return response(status, f"{status} {REASONS[status]}\n".encode())

    def _on_loop_error(self, loop, context: dict) -> None:
        """What asyncio reports (e.g. accept() out of file descriptors): one line, once."""
        exc = context.get("exception")
        log_once(f"probe port: {context['message']}" + (f": {exc}" if exc else ""))


def new_loop() -> asyncio.AbstractEventLoop:
    """asyncio's selector loop; OSError if the fds it needs (an epoll, a socket pair) cannot be
    made (EMFILE). Made once first by hand: asyncio's constructor failing half-way leaves a loop
    whose __del__ prints a traceback. The supervisor starts no other thread before this."""
    made = []
    try:
        made.append(select.epoll())
        made.extend(socket.socketpair())
    finally:
        for f in made:
            f.close()
    return asyncio.new_event_loop()


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

    async def answer(kind: str) -> tuple[bool, str]:
        current = state().value
        # Ask vLLM only when the answer depends on it (never once readiness is lost).
        ok = decide(kind, current, False) or (decide(kind, current, True) and await health())
        return ok, f"{'' if ok else 'not '}{kind}: state {current}"

    return ProbeServer(probe_port, answer, metrics).start()


class CachedHealth:
    """vLLM's /health, asked from the port's loop (see above): a probe that finds the last answer
    older than HEALTH_CACHE_S waits for the check in flight, starting one if there is none."""

    def __init__(self, url: str, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.ok, self.at = False, None
        self.check: asyncio.Future[bool] | None = None
        try:
            tls, self.host, self.port = target(url)
            # Resolved once, here: in the loop a name would be resolved on an executor thread.
            infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            self.addresses = [info[4][0] for info in infos]
        except (OSError, ValueError):
            tls, self.host, self.port, self.addresses = False, "", 0, []
        self.tls = tls_context() if tls else None

    async def __call__(self) -> bool:
        if self.at is not None and self.clock() - self.at < HEALTH_CACHE_S:
            return self.ok
        if self.check is None:
            self.check = asyncio.ensure_future(self._check())
        return await asyncio.shield(self.check)  # a probe that goes away leaves it running

    async def _check(self) -> bool:
        got = bytearray()
        try:
            await asyncio.wait_for(self._get(got), PROBE_TIMEOUT_S)
            status = parse_answer(bytes(got), HEALTH_MAX)[0]
        except (OSError, ValueError, asyncio.TimeoutError) as e:  # ssl's errors are among them
            status = parse_answer(bytes(got), HEALTH_MAX, e)[0]
        finally:
            self.check = None
        self.ok, self.at = status == 200, self.clock()  # after the check: a slow one is not stale
        return self.ok

    async def _get(self, got: bytearray) -> None:
        """GET /health into `got` until the server closes (or the answer passes HEALTH_MAX)."""
        error: OSError = OSError("no address for vLLM")
        for address in self.addresses:
            try:
                reader, writer = await asyncio.open_connection(
                    address,
                    self.port,
                    ssl=self.tls,
                    server_hostname=self.host if self.tls else None,
                )
                break
            except OSError as e:
                error = e
        else:
            raise error
        try:
            writer.write(request(self.host, self.port, "/health"))
            while len(got) <= HEALTH_MAX and (data := await reader.read(65536)):
                got += data
        finally:
            writer.transport.abort()
