"""JSON log records for vLLM's processes (INTEL_VLLM_LOG_FORMAT=json): a logging.Formatter and
the logging.config dictionary the supervisor hands vLLM through VLLM_LOGGING_CONFIG_PATH, which
vLLM applies to its own loggers and to uvicorn's (its access log included). Imported inside vLLM's
processes: the standard library only. Its clock format is the supervisor's too (log.py).
"""

from __future__ import annotations

import datetime
import json
import logging

LOGGERS = ("vllm", "uvicorn", "uvicorn.error", "uvicorn.access")


def timestamp(seconds: float | None = None) -> str:
    """ISO 8601 in UTC, milliseconds: every JSON line's "time", vLLM's and the supervisor's."""
    moment = datetime.datetime.fromtimestamp(
        seconds if seconds is not None else datetime.datetime.now().timestamp(),
        datetime.timezone.utc,
    )
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """time, level, source (vllm), event (log), message, logger, pid, and the exception's text."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": timestamp(record.created),
            "level": record.levelname.lower(),
            "source": "vllm",
            "event": "log",
            "message": record.getMessage(),
            "logger": record.name,
            "pid": record.process,
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def logging_config(level: str = "INFO") -> dict:
    """vLLM's loggers and uvicorn's on one JSON handler (stdout, as vLLM's own default)."""
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stdout"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {"json": handler},
        "loggers": {
            name: {"handlers": ["json"], "level": level, "propagate": False}
            for name in LOGGERS
            if name != "uvicorn.error"  # it propagates to "uvicorn"
        }
        | {"uvicorn.error": {"level": level}},
        "root": {"handlers": ["json"], "level": "WARNING"},
    }
