"""The supervisor's log lines: one line each, on stderr, prefixed so they stand out from vLLM's.

With INTEL_VLLM_LOG_FORMAT=json every line of a `serve` run is one JSON object instead: the
supervisor's (`source: entrypoint`, an `event` and its fields), vLLM's logging records (through
vllm_intel.in_vllm.jsonlog, VLLM_LOGGING_CONFIG_PATH) and anything else vLLM's processes print (relayed
by the supervisor, `event: output`). The fields of every object: time (UTC, ISO 8601), level,
source, event, message.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import socket
import stat
import threading
import time

from ..in_vllm.jsonlog import timestamp

FORMAT_ENV = "INTEL_VLLM_LOG_FORMAT"
FORMATS = ("text", "json")


def json_mode(env=os.environ) -> bool:
    return env.get(FORMAT_ENV) == "json"


def record(message: str, *, level="info", source="entrypoint", event="log", **fields) -> str:
    """One JSON log line (no newline)."""
    head = {"time": timestamp(), "level": level, "source": source, "event": event}
    return json.dumps({**head, "message": message, **fields}, ensure_ascii=False, default=str)


# Invariant: writing a log line never raises and never blocks for long, whatever reads our
# stdout and stderr (a lost log line beats a lost request). A reader gone (EPIPE; SIGPIPE is
# ignored), a terminal gone (EIO), a write refused (EAGAIN, ENOSPC): the line is dropped and
# counted. A reader that stopped reading: the write waits for room at most WRITE_WAIT_S, and not
# at all once a write could not finish, until one does again (the exit line: LAST_WAIT_S, stalled
# or not, within the supervisor's time left). Each piece written is at most
# PIPE_BUF bytes, and only once poll() said there is room: such a write to a pipe does not block
# (a pipe has room for PIPE_BUF bytes once it is not full), nor does a send with MSG_DONTWAIT.
# The file description itself is shared with vLLM and is left as it is (blocking).
# Whole lines or none: a line once started is finished before anything else goes to its stream
# (fds 1 and 2 on one pipe, file or terminal are one stream). When the wait runs out mid-line,
# the rest of that one line is kept (at most one per stream) and written first next time, and at
# exit for at most LAST_WAIT_S; the lines not started are dropped and counted.
WRITE_WAIT_S = 0.1
LAST_WAIT_S = 0.5
PIPE_BUF = 4096
lost = {1: 0, 2: 0}  # lines dropped, per fd
_stalled: dict[int, bool] = {}  # per stream (_stream)
_pending: dict[int, bytes] = {}  # per stream: the rest of the line started on it
# Whole lines only: the supervisor's own lines and the relay's (another thread) go to the same
# streams; each line goes whole, never interleaved with another thread's.
_write_lock = threading.Lock()


def write_lines(fd: int, data: bytes, wait: float | None = None) -> None:
    """Write whole lines (bytes ending in a newline) to fd 1 or 2: see the invariant above.
    `wait`: wait at least this long for room, stalled or not."""
    if not data:
        return
    if not data.endswith(b"\n"):
        data += b"\n"
    with _write_lock:
        key = _stream(fd)
        budget = 0.0 if _stalled.get(key) else WRITE_WAIT_S
        end = time.monotonic() + max(budget, wait or 0.0)
        if not _finish_pending(key, end):
            _stalled[key] = True
            lost[fd] += data.count(b"\n")
            return
        done = _write(key, memoryview(data), end)
        _stalled[key] = done < len(data)
        if _stalled[key]:
            start = data.rfind(b"\n", 0, done) + 1  # of the line cut at `done`
            stop = data.find(b"\n", done) + 1 if done > start else done
            if stop > done:
                _pending[key] = data[done:stop]
            lost[fd] += data.count(b"\n", stop)


def _finish_pending(key: int, end: float) -> bool:
    """Write the rest of the line started on stream `key`; False if some of it is still left."""
    rest = _pending.pop(key, b"")
    done = _write(key, memoryview(rest), end)
    if done < len(rest):
        _pending[key] = rest[done:]
        return False
    return True


@atexit.register
def _finish_lines() -> None:
    """At exit, the rest of each line a reader already has the start of, if it takes it within
    LAST_WAIT_S (a reader gone fails at once)."""
    end = time.monotonic() + LAST_WAIT_S
    if _pending and _write_lock.acquire(timeout=LAST_WAIT_S):
        try:
            for key in list(_pending):
                _finish_pending(key, end)
        finally:
            _write_lock.release()


_streams: dict[int, int] = {}


def _stream(fd: int) -> int:
    """The fd that stands for `fd`'s stream: 1 for fd 2 when both write to the same pipe, file or
    terminal (`2>&1`), else `fd`."""
    if fd not in _streams:
        try:
            same = fd == 2 and os.path.samestat(os.fstat(1), os.fstat(2))
        except (OSError, ValueError):
            same = False
        _streams[fd] = 1 if same else fd
    return _streams[fd]


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


def log(
    msg: str, *, event: str = "log", level: str = "info", wait: float | None = None, **fields
) -> None:
    """`fields`: the event's values, kept apart in JSON (the text line has them in `msg`);
    `wait`: write_lines'."""
    if json_mode():
        line = record(msg, level=level, event=event, **fields)
    else:
        line = f"[entrypoint] {msg}"
    write_lines(2, (line + "\n").encode("utf-8", "replace"), wait)
