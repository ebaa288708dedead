"""The supervisor's log lines: one line each, on stderr, prefixed so they stand out from vLLM's.

With INTEL_VLLM_LOG_FORMAT=json every line of a `serve` run is one JSON object instead: the
supervisor's (`source: entrypoint`, an `event` and its fields), vLLM's logging records (through
vllm_intel.jsonlog, VLLM_LOGGING_CONFIG_PATH) and anything else vLLM's processes print (relayed
by the supervisor, `event: output`). The fields of every object: time (UTC, ISO 8601), level,
source, event, message.
"""

from __future__ import annotations

import datetime
import json
import os
import select
import socket
import stat
import threading
import time

FORMAT_ENV = "INTEL_VLLM_LOG_FORMAT"
FORMATS = ("text", "json")


def json_mode(env=os.environ) -> bool:
    return env.get(FORMAT_ENV) == "json"


def timestamp(seconds: float | None = None) -> str:
    moment = datetime.datetime.fromtimestamp(
        seconds if seconds is not None else datetime.datetime.now().timestamp(),
        datetime.timezone.utc,
    )
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def record(message: str, *, level="info", source="entrypoint", event="log", **fields) -> str:
    """One JSON log line (no newline)."""
    head = {"time": timestamp(), "level": level, "source": source, "event": event}
    return json.dumps({**head, "message": message, **fields}, ensure_ascii=False, default=str)


# Invariant: writing a log line never raises and never blocks for long, whatever reads our
# stdout and stderr (a lost log line beats a lost request). A reader gone (EPIPE; SIGPIPE is
# ignored), a terminal gone (EIO), a write refused (EAGAIN, ENOSPC): the line is dropped and
# counted. A reader that stopped reading: the write waits for room at most WRITE_WAIT_S, and not
# at all once a line was dropped, until one is written again. Each piece written is at most
# PIPE_BUF bytes, and only once poll() said there is room: such a write to a pipe does not block
# (a pipe has room for PIPE_BUF bytes once it is not full), nor does a send with MSG_DONTWAIT.
# The file description itself is shared with vLLM and is left as it is (blocking).
WRITE_WAIT_S = 0.1
PIPE_BUF = 4096
lost = {1: 0, 2: 0}  # lines dropped, per fd
_stalled = {1: False, 2: False}
# Whole lines only: the supervisor's own lines and the relay's (another thread) go to the same
# streams; each line goes whole, never interleaved with another thread's.
_write_lock = threading.Lock()


def write_lines(fd: int, data: bytes) -> None:
    """Write whole lines (bytes ending in a newline) to fd 1 or 2: see the invariant above."""
    if not data:
        return
    with _write_lock:
        budget = 0.0 if _stalled[fd] else WRITE_WAIT_S
        written = _write(fd, memoryview(data), time.monotonic() + budget)
        _stalled[fd] = written < len(data)
        if _stalled[fd]:
            lost[fd] += max(data.count(b"\n", written), 1)


def _write(fd: int, data: memoryview, end: float) -> int:
    """Bytes of `data` written to `fd` by `end` (time.monotonic()); never raises."""
    done = 0
    sock = _socket(fd)
    while done < len(data):
        piece = data[done : done + PIPE_BUF]
        try:
            if not select.select([], [fd], [], max(end - time.monotonic(), 0))[1]:
                return done
            done += sock.send(piece, socket.MSG_DONTWAIT) if sock else os.write(fd, piece)
        except (OSError, ValueError):  # EPIPE, EIO, EAGAIN, EBADF, ...; ValueError: a bad fd
            return done
    return done


_sockets: dict[int, socket.socket | None] = {}


def _socket(fd: int) -> socket.socket | None:
    """A socket object for `fd` if it is a socket (journald's stdout stream), else None."""
    if fd not in _sockets:
        try:
            is_sock = stat.S_ISSOCK(os.fstat(fd).st_mode)
            _sockets[fd] = socket.socket(fileno=os.dup(fd)) if is_sock else None
        except OSError:
            _sockets[fd] = None
    return _sockets[fd]


def lost_lines() -> str:
    """ "; N log line(s) lost ..." for the exit line, or "" if none was."""
    n = lost[1] + lost[2]
    return f"; {n} log line(s) lost (stdout / stderr not writable)" if n else ""


def log(msg: str, *, event: str = "log", level: str = "info", **fields) -> None:
    """`fields`: the event's values, kept apart in JSON (the text line has them in `msg`)."""
    if json_mode():
        line = record(msg, level=level, event=event, **fields)
    else:
        line = f"[entrypoint] {msg}"
    write_lines(2, (line + "\n").encode("utf-8", "replace"))
