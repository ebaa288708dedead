"""The exit-code contract and the one-line error every bad input becomes.

The codes are documented from `EXIT_MEANINGS` (docs/settings.md, README, `--help`); the rule
from vLLM's returncode to ours is `exit_code()`.
"""

from __future__ import annotations

import enum


class Exit(enum.IntEnum):
    CONFIG = 64  # EX_USAGE: bad input, nothing started
    NO_DEVICE = 65
    PREFETCH = 69  # EX_UNAVAILABLE: the hub could not give us the model
    UNEXPECTED = 70
    FORCED = 124
    CANNOT_EXEC = 126
    NOT_FOUND = 127


class ConfigError(Exception):
    """Bad input: reported as one line, exit 64, nothing started."""


class StoppedBeforeStart(Exception):
    """SIGTERM / SIGINT before vLLM was started: nothing to drain, exit 128 + the signal."""

    def __init__(self, sig: int, phase: str):
        super().__init__(f"{sig} during {phase}")
        self.sig, self.phase = sig, phase


def exit_code(returncode: int, *, stop_requested: bool, escalated: bool) -> int:
    """The entrypoint's exit code for vLLM's returncode (Popen style: -N = killed by signal N)."""
    if escalated and returncode != 0:
        return Exit.FORCED
    if returncode < 0:
        return 128 - returncode
    if not stop_requested:
        return Exit.UNEXPECTED if returncode == 0 else returncode
    return returncode


def shown(value, limit: int = 40, quote: bool = True) -> str:
    """repr(value) (or a printable str as it is, quote=False), cut to `limit` characters: an
    error line stays one short line whatever the input."""
    if not quote and isinstance(value, str) and value.isprintable() and len(value) <= limit:
        return value
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 4]}...{text[-1]} ({len(str(value))} chars)"
