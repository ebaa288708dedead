"""The exit-code contract and the one-line error every bad input becomes.

The codes are documented from `EXIT_MEANINGS` (docs/settings.md, README, `--help`); the rule
from vLLM's returncode to ours is `exit_code()`.
"""

from __future__ import annotations

import enum
import json
import re


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
        # Any code, 0 included: an engine that died at start exits 1, and an orchestrator must
        # tell "asked to stop" from "died" (the exit-code table: 70).
        return Exit.UNEXPECTED
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


# Every number read from the environment, a command-line flag or a file goes through
# parse_whole: ASCII digits only (int() takes "١٢" and "²"-free Unicode digits, and raises past
# 4300 digits), at most MAX_DIGITS of them, one line naming where it came from.
MAX_DIGITS = 12
WHOLE = re.compile(r"\s*([+-]?)([0-9]+)\s*", re.ASCII)


def parse_whole(
    name: str,
    value,
    lo: int | None = None,
    hi: int | None = None,
    signed: bool = False,
    what: str = "a whole number",
    unit: str = "",
) -> int:
    """`value` (a str, or an int from a parsed file) as an int, lo..hi. Raises ConfigError."""
    if type(value) is int:
        number = value
    else:
        m = WHOLE.fullmatch(value) if isinstance(value, str) else None
        if m is None or (m.group(1) and not signed):
            raise ConfigError(f"{name} must be {what} (ASCII digits), not {shown(value)}")
        digits = m.group(2).lstrip("0") or "0"
        if len(digits) > MAX_DIGITS and hi is not None:
            raise ConfigError(
                f"{name} must be at most {hi}{unit} (at most {MAX_DIGITS} digits), "
                f"not {shown(value)}"
            )
        if len(digits) > MAX_DIGITS:
            raise ConfigError(
                f"{name} must be {what} of at most {MAX_DIGITS} digits, not {shown(value)}"
            )
        number = -int(digits) if m.group(1) == "-" else int(digits)
    if lo is not None and hi is not None and not lo <= number <= hi:
        if lo == 0 and number >= 0:
            raise ConfigError(f"{name} must be at most {hi}{unit}, not {number}")
        raise ConfigError(f"{name} must be between {lo} and {hi}{unit}, not {number}")
    if lo is not None and number < lo:
        raise ConfigError(f"{name} must be at least {lo}{unit}, not {number}")
    if hi is not None and number > hi:
        raise ConfigError(f"{name} must be at most {hi}{unit}, not {number}")
    return number


# Every JSON document the supervisor reads (the state file, claims, vLLM's reports, a model's
# config.json) goes through load_json: bounded in size by its caller, in depth here (json's C
# parser recurses, and a deep enough file raises RecursionError, not ValueError).
MAX_JSON_DEPTH = 64


def load_json(raw: bytes | str, max_depth: int = MAX_JSON_DEPTH):
    """json.loads(raw), nested at most `max_depth` deep. Raises ValueError (JSONDecodeError,
    UnicodeDecodeError, or "nested too deeply") and nothing else."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8")  # UnicodeDecodeError is a ValueError
    if _depth(raw) > max_depth:
        raise ValueError(f"nested more than {max_depth} deep")
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError(f"nested more than {max_depth} deep") from None


def _depth(text: str) -> int:
    """The deepest nesting of [ and { outside strings (an upper bound for malformed text)."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return 0  # cannot be deeper: the common case costs two counts
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", text)
    depth = deepest = 0
    for ch in re.sub(r"[^\[\]{}]", "", text):
        depth = depth + 1 if ch in "[{" else depth - 1
        deepest = max(deepest, depth)
    return deepest
