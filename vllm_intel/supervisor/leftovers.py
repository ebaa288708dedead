"""What vLLM leaves behind at its exit, dealt with beside the loop (extension.py): its
processes that outlived its process group are ended, and an OOM kill in its cgroup is named on
the exit line."""

from __future__ import annotations

import signal
import time

import psutil

from . import limits
from .extension import Extension
from .log import log
from .loop import reap_all
from .timing import KILL_GRACE_S


class OomKills(Extension):
    """The cgroup's OOM kills, counted when made (before vLLM's spawn) and again at its exit:
    the exit line names the kill and the limit (limits.oom_cause)."""

    def __init__(self) -> None:
        self.before = limits.oom_kills()

    def exit_words(self, sup) -> str:
        return limits.oom_cause(self.before, sup.returncode)


class Descendants(Extension):
    """Ends, once vLLM's process group is gone, its processes that left the group."""

    def on_group_gone(self, sup) -> None:
        end_descendants(sup)


def end_descendants(sup) -> None:
    """Every process of vLLM still running once its group is gone: those that left the group
    (setsid) and were re-parented to us, the subreaper. SIGTERM, SIGKILL KILL_GRACE_S later,
    reaped; within time_left; one line."""
    left = descendants()
    if not left:
        return
    names = ", ".join(f"{p.pid} {_name(p)}" for p in left[:5]) + ", ..." * (len(left) > 5)
    signal_all(left, signal.SIGTERM)
    alive = wait_gone(left, sup.time_left(KILL_GRACE_S))
    said = "SIGTERM"
    if alive:
        signal_all(alive, signal.SIGKILL)
        said += f", SIGKILL {KILL_GRACE_S} s later ({len(alive)} ignored SIGTERM)"
        alive = wait_gone(alive, sup.time_left(KILL_GRACE_S))
    log(
        f"{len(left)} process(es) of vLLM outside its process group outlived it ({names}): "
        + said
        + (f"; {len(alive)} still running at our exit" if alive else "; reaped")
    )


def descendants() -> list[psutil.Process]:
    """Our descendants still running (zombies among our children reaped first)."""
    reap_all()
    try:
        return [p for p in psutil.Process().children(recursive=True) if _running(p)]
    except psutil.Error:
        return []


def _running(p: psutil.Process) -> bool:
    """Still the process listed (not a new one with its pid) and not a zombie."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:
        return "?"


def signal_all(procs: list[psutil.Process], sig: int) -> None:
    """`sig` to each of `procs` that is still the process listed (psutil checks, so a pid reused
    since is never signalled)."""
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


def wait_gone(procs: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    """Reap until `procs` are gone or `seconds` pass; those still running."""
    end = time.monotonic() + seconds
    while True:
        reap_all()
        alive = [p for p in procs if _running(p)]
        if not alive or time.monotonic() >= end:
            return alive
        time.sleep(0.01)
