"""INTEL_VLLM_LOG_FORMAT=json: every line vLLM's processes print reaches the container's log as
one JSON object. vLLM's logging records already are (vllm_intel.jsonlog) and pass as they are;
anything else (a progress bar, a C++ warning, a traceback) is wrapped (`event: output`, `stream`).

One thread, opt-in (the default log format starts none): it reads vLLM's stdout and stderr pipes
until every process holding them has exited, and writes each line to the supervisor's own stdout
or stderr (log.write_lines: a line nobody can take is dropped, so vLLM's pipes are always read and
vLLM never blocks on its output). A line longer than MAX_LINE is cut into pieces, so memory stays
bounded.
"""

from __future__ import annotations

import os
import selectors
import threading

from .errors import load_json
from .extension import Extension
from .log import record, write_lines

MAX_LINE = 1 << 16
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


class Relay(threading.Thread, Extension):
    def __init__(self) -> None:
        super().__init__(name="log-relay", daemon=True)
        self.out_r, self.out_w = os.pipe()
        self.err_r, self.err_w = os.pipe()

    def child_fds(self) -> tuple[int, int]:
        """vLLM's stdout and stderr; the supervisor closes its copies once vLLM has them."""
        return self.out_w, self.err_w

    def on_spawn(self, sup) -> None:
        os.close(self.out_w)  # vLLM holds them now: EOF once every process of it is gone
        os.close(self.err_w)

    def on_exit(self, sup) -> None:
        self.join(sup.time_left(FLUSH_S))  # vLLM's last lines; no writer is left

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        targets = {self.out_r: ("stdout", 1), self.err_r: ("stderr", 2)}
        buffers = {fd: bytearray() for fd in targets}
        for fd in targets:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            for key, _ in sel.select():
                fd = key.fd
                stream, out = targets[fd]
                data = os.read(fd, 65536)
                lines = split_lines(buffers[fd], data) if data else [bytes(buffers[fd])]
                if not data:
                    sel.unregister(fd)
                    os.close(fd)
                converted = [as_json_line(line, stream) for line in lines]
                write_lines(out, b"".join(c for c in converted if c))
        sel.close()
