"""The run directory: the one contract between the supervisor and the code it installs in vLLM's
processes (the patch plugin, startup_phases, drain_forecast).

The supervisor makes the directory (its own, 0700) and names it to vLLM in ENV. Each process
writes only its own files there, with `write` (a rename: a reader sees a whole file, old or new);
the supervisor reads them with `read` and `read_all` (never through a symlink, never a FIFO, at
most MAX_BYTES a file and MAX_FILES of a kind) and trusts nothing in them beyond their shape.
Standard library only: it is imported inside vLLM's processes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import stat

ENV = "INTEL_VLLM_RUN_DIR"
FORECAST = "drain-forecast.json"  # the API server's drain forecast (drain_forecast.Forecast)
# + the writer's pid + ".json":
RESULT = "drain-result-"  # each API server's counts of the drain's ends (Result, below)
PATCH_STATES = "patch-states-"  # each process's patch states (vllm_intel.patches)
STARTUP = "startup-"  # each process's start-up phases and compiled graphs (startup_phases)
MAX_BYTES = 8192  # a file larger is not one of ours
MAX_FILES = 64  # a server has a handful of processes; more are not ours to read


@dataclasses.dataclass(frozen=True)
class Result:
    """How the drain's requests ended, each counted once, at its final event in vLLM's API
    server (requests as its output processor holds them: one with n > 1 counts n); every count
    but `open` only grows."""

    in_flight: int  # open at the drain's start, or joining it after (accepted before it)
    finished: int  # finish_reason stop or length
    aborted: int  # finish_reason abort: the drain deadline's abort, a client gone
    failed: int  # ended by an error: an engine error, or the engine stopped first
    open: int  # no final event yet

    def brief(self) -> str:
        """The supervisor's exit-line words for it."""
        out = f"{self.in_flight} in flight at SIGTERM, {self.finished} finished, "
        out += f"{self.aborted} aborted"
        if self.failed:
            out += f", {self.failed} failed"
        return out + (f", {self.open} still running" if self.open else "")


def path(name: str, env=os.environ) -> str | None:
    """`name` in the run directory `env` names, or None when it names none."""
    where = env.get(ENV)
    return os.path.join(where, name) if where else None


def own(prefix: str, env=os.environ) -> str | None:
    """This process's file of kind `prefix` in the run directory, or None."""
    return path(f"{prefix}{os.getpid()}.json", env)


def write(where: str, data) -> None:
    """Replace the file `where` by `data` as JSON through a rename (a new mode-0600 file, never
    through a symlink). Best effort: a report never fails the process that writes it."""
    tmp = f"{where}.{os.getpid()}.tmp"
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(tmp, flags, 0o600), "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, where)
    except OSError:
        try:  # a full disk: no half-written file left behind
            os.unlink(tmp)
        except OSError:
            pass


def read(where: str | os.PathLike):
    """The JSON value in the file `where`, or None (absent, a symlink, not a regular file, larger
    than MAX_BYTES, not JSON)."""
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            raw = f.read(MAX_BYTES + 1)
        return json.loads(raw) if len(raw) <= MAX_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None


def read_all(where: pathlib.Path, prefix: str) -> list:
    """The JSON value of each `<prefix>*.json` in the directory `where` that `read` accepts."""
    try:
        names = sorted(where.glob(f"{prefix}*.json"))[:MAX_FILES]
    except OSError:
        return []
    return [data for data in map(read, names) if data is not None]
