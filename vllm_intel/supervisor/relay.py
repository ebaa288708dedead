"""INTEL_VLLM_LOG_FORMAT=json: every line vLLM's processes print reaches the container's log as
one JSON object. vLLM's logging records already are (vllm_intel.in_vllm.jsonlog) and pass as they are;
anything else (a progress bar, a C++ warning, a traceback) is wrapped (`event: output`, `stream`).

No thread of its own: the loop pumps vLLM's stdout and stderr pipes on every tick (at least every
TICK_S) and while it waits for vLLM's processes to exit, and once more before its exit line; then
on_exit reads what is left until every process holding the pipes has closed them. The pipes hold
PIPE_SIZE, far more than vLLM prints in a tick, so vLLM never waits on its output; each line goes
to the supervisor's own stdout or stderr (log.write_lines: a line nobody can take is dropped). A
line longer than MAX_LINE is cut into pieces, so memory stays bounded.
"""

from __future__ import annotations

import fcntl
import os
import selectors
import time

from .errors import load_json
from .extension import Extension
from .log import record, write_lines

MAX_LINE = 1 << 16
PIPE_SIZE = 1 << 20  # the unprivileged maximum (pipe-max-size)
READ_SIZE = 1 << 16
FLUSH_S = 2.0  # after vLLM's exit, how long its last lines may take to reach the log


def as_json_line(raw: bytes, stream: str) -> bytes | None:
    """The JSON line for one line vLLM printed (None: a blank line, dropped)."""
    text = raw.decode("utf-8", "replace").rstrip("\r\n")
    if "\r" in text:  # a progress bar redrawn in place: its last state
        text = text.rsplit("\r", 1)[-1]
    if not text.strip():
        return None
    if text.startswith("{"):
        try:
            if isinstance(load_json(text), dict):
                return text.encode() + b"\n"
        except ValueError:
            pass
    return (record(text, source="vllm", event="output", stream=stream) + "\n").encode()


def split_lines(buffer: bytearray, data: bytes) -> list[bytes]:
    """Append `data` to `buffer`; return the complete lines (pieces of MAX_LINE when longer)."""
    buffer += data
    lines = []
    while True:
        end = buffer.find(b"\n")
        if end < 0:
            if len(buffer) >= MAX_LINE:
                end = MAX_LINE - 1
            else:
                return lines
        lines.append(bytes(buffer[: end + 1]))
        del buffer[: end + 1]


class Relay(Extension):
    def __init__(self) -> None:
        self.out_r, self.out_w = os.pipe()
        self.err_r, self.err_w = os.pipe()
        for fd in (self.out_w, self.err_w):
            try:
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
            except OSError:  # above /proc/sys/fs/pipe-max-size: the default 64 KiB
                pass
        self.targets = {self.out_r: ("stdout", 1), self.err_r: ("stderr", 2)}
        self.buffers = {fd: bytearray() for fd in self.targets}
        self.selector = selectors.DefaultSelector()
        for fd in self.targets:
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ)

    def child_fds(self) -> tuple[int, int]:
        """vLLM's stdout and stderr; the supervisor closes its copies once vLLM has them."""
        return self.out_w, self.err_w

    def on_spawn(self, sup) -> None:
        os.close(self.out_w)  # vLLM holds them now: EOF once every process of it is gone
        os.close(self.err_w)

    def on_tick(self, sup) -> None:
        self.pump(0)

    def on_exit(self, sup) -> None:
        self.pump(sup.time_left(FLUSH_S))  # vLLM's last lines; no writer is left

    def pump(self, seconds: float) -> None:
        """Relay what the pipes hold, at most their size from each (a chatty vLLM cannot hold
        the loop); with `seconds`, go on until their EOF or that long."""
        end = time.monotonic() + seconds
        reads = 0
        while self.targets and (seconds or reads < 2 * PIPE_SIZE // READ_SIZE):
            ready = self.selector.select(max(end - time.monotonic(), 0))
            if not ready:
                return
            for key, _ in ready:
                self.read(key.fd)
                reads += 1

    def read(self, fd: int) -> None:
        stream, out = self.targets[fd]
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return
        lines = split_lines(self.buffers[fd], data) if data else [bytes(self.buffers[fd])]
        if not data:
            del self.targets[fd]
            self.selector.unregister(fd)
            os.close(fd)
        converted = [as_json_line(line, stream) for line in lines]
        write_lines(out, b"".join(c for c in converted if c))
