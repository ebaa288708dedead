"""The signals `serve` handles, held from its first line on.

Invariant: from the first thing `serve` does until it exits, WATCHED is blocked in every thread.
A blocked signal stays pending (the kernel drops a signal sent to PID 1 at its default action, but
never a blocked one): a stop during start-up waits for the next phase's `check_stop`, or, once
vLLM runs, for the loop's sigtimedwait. Light on purpose: launch.main imports it before anything
else.
"""

from __future__ import annotations

import signal

from .errors import StoppedBeforeStart

STOPPING = frozenset({signal.SIGTERM, signal.SIGINT})
# Not forwarded: SIGCHLD (ours), the job-control stop signals (a stopped vLLM would hold every
# request), faults raised by our own code, SIGPIPE (raised by our own writes to a closed log
# pipe, and ignored: log.py counts the line lost) and what cannot be caught at all.
NOT_FORWARDED = frozenset(
    {
        signal.SIGCHLD,
        signal.SIGTSTP,
        signal.SIGTTIN,
        signal.SIGTTOU,
        signal.SIGKILL,
        signal.SIGSTOP,
        signal.SIGSEGV,
        signal.SIGBUS,
        signal.SIGILL,
        signal.SIGFPE,
        signal.SIGABRT,
        signal.SIGTRAP,
        signal.SIGSYS,
        signal.SIGPIPE,
    }
)
FORWARDED = frozenset(signal.valid_signals()) - NOT_FORWARDED - STOPPING
WATCHED = FORWARDED | STOPPING | {signal.SIGCHLD}


def hold() -> None:
    """`serve`'s first act: WATCHED blocked (every thread started later inherits the mask), and
    SIGPIPE ignored (a write to a log pipe nobody reads fails with EPIPE instead of killing us)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)


def check_stop(phase: str) -> None:
    """Between two start-up phases: a pending SIGTERM / SIGINT ends the start-up. Raises
    StoppedBeforeStart; the signal stays pending (nothing after this waits for it)."""
    pending = signal.sigpending() & STOPPING
    if pending:
        raise StoppedBeforeStart(min(pending), phase)
