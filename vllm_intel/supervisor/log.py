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
import sys
import threading

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


# Whole lines only: the supervisor's own lines and the relay's (another thread) go to the same
# streams; print() writes a message and its newline apart, so a relayed line could land between.
_write_lock = threading.Lock()


def write_lines(out, data: bytes) -> None:
    """Write whole lines (bytes ending in a newline) to the text stream `out`, never interleaved
    with another thread's."""
    with _write_lock:
        out.flush()
        out.buffer.write(data)
        out.buffer.flush()


def log(msg: str, *, event: str = "log", level: str = "info", **fields) -> None:
    """`fields`: the event's values, kept apart in JSON (the text line has them in `msg`)."""
    if json_mode():
        line = record(msg, level=level, event=event, **fields)
    else:
        line = f"[entrypoint] {msg}"
    write_lines(sys.stderr, (line + "\n").encode("utf-8", "replace"))
