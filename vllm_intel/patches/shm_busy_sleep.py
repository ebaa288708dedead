"""shm-busy-sleep: vLLM's shared-memory queue readers sleep briefly between checks instead of
spinning, from ``VLLM_SHM_BROADCAST_BUSY_SLEEP_S``; the CPU plan sets it under a CPU quota and
when no CPU is left beside vLLM's OpenMP threads.

Target:   ``vllm.distributed.device_communicators.shm_broadcast.SpinCondition.wait`` (its busy
          branch: ``sched_yield()`` while less than ``busy_loop_s``, 1 s, has passed since the
          last read).
Upstream: vllm PR #52848 ("[Core] Add configurable sleep to shm broadcast busy loop",
          https://github.com/vllm-project/vllm/pull/52848, open) adds this same variable,
          default 0 (no sleep); where the installed shm_broadcast reads it, this patch stands
          aside.
Releases: vLLM whose SpinCondition has the busy branch (since vllm PR #28053) to 0.32.0 at
          least; any platform; applied only when the variable is set.

What goes wrong: after each read a reader (the worker waiting for the scheduler's next step, the
engine core waiting for the worker's output) spins on ``sched_yield`` for 1 s. While tokens are
generated a message comes every few milliseconds, so both spin from the first token to the last.
On a dedicated CPU the spin gives its CPU away at once; under a CPU quota (``docker --cpus``,
Kubernetes ``limits.cpu``) on more CPUs than the quota, it runs beside the work and bills the
quota: on 2 CPUs under ``--cpus 1`` the container used about twice the CPU time per token of
the same server on a one-CPU cpuset (docs/bench.md, section limits). With fewer than two CPUs
beside vLLM's OpenMP threads (2 cores, no quota) the engine core's spin takes the CPU the API
server needs: new connections waited 5-23 s and streams got their first byte when the whole
completion was done (docs/bench.md, section stall). What it changes: in the
busy branch the reader sleeps ``VLLM_SHM_BROADCAST_BUSY_SLEEP_S`` seconds instead of yielding,
bounding how often it checks; the 1 s window and the idle path (zmq notification) are vLLM's.
Shortening the window instead (vllm PR #52814's ``VLLM_SHM_BROADCAST_BUSY_LOOP_S``) was tried
and rejected: on 0.32.0 a reader parked on the notification missed wake-ups and serving stalled
(0-50 tokens/s instead of 1000-1700). Blocking on vLLM's zmq write notification for up to 1 ms
inside the window, instead of sleeping, was tried too: 2158-2612 tokens/s against the sleep's
2990-3835 (docs/bench.md, "spin or sleep"). Unset or 0: vLLM's ``sched_yield``, nothing patched.
"""

from __future__ import annotations

import math
import os

from ._base import NEEDED, NOT_APPLICABLE, UPSTREAM, Patch, code_source, module_source

ENV = "VLLM_SHM_BROADCAST_BUSY_SLEEP_S"
MODULE = "vllm.distributed.device_communicators.shm_broadcast"


def busy_sleep_s(env=os.environ) -> float:
    """The variable's value (0 when unset); ValueError, one line, unless a number in [0, 0.01]."""
    raw = env.get(ENV, "0")
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 <= value <= 0.01:
        raise ValueError(f"{ENV} must be seconds between 0 and 0.01, not {raw!r}")
    return value


class ShmBusySleep(Patch):
    name = "shm-busy-sleep"

    def check(self) -> tuple[str, str]:
        src = module_source(MODULE)
        if src is None or "class SpinCondition" not in src:
            return NOT_APPLICABLE, "this vLLM has no SpinCondition (shm_broadcast)"
        if ENV in src:
            return UPSTREAM, f"shm_broadcast reads {ENV} itself (vllm PR #52848)"
        wait = code_source(MODULE, "SpinCondition.wait") or ""
        if "sched_yield()" not in wait or "busy_loop_s" not in wait:
            return NOT_APPLICABLE, "SpinCondition.wait has no sched_yield busy branch here"
        value = busy_sleep_s()  # raises: state failed, with the one-line reason
        if value == 0:
            return NOT_APPLICABLE, f"{ENV} not set: vLLM's sched_yield busy loop"
        return NEEDED, f"readers sleep {value * 1e6:.0f} us between checks ({ENV})"

    def _apply(self) -> None:
        import time

        from vllm.distributed.device_communicators import shm_broadcast

        cls = shm_broadcast.SpinCondition
        orig = cls.wait
        pause = busy_sleep_s()

        def wait(self, timeout_ms: int | None = None) -> None:
            if time.monotonic() <= self.last_read + self.busy_loop_s:
                time.sleep(pause)  # vLLM: sched_yield(), a spin under a quota
                return
            orig(self, timeout_ms)

        wait.__wrapped__ = orig
        self._replace(cls, "wait", wait)


PATCH = ShmBusySleep()
