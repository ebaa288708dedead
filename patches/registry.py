"""The list of patch modules, in the order they are applied, and the env-var selection.

Adding a patch is one line: append its module name to PATCH_MODULES (the module defines
``PATCH = <Patch subclass>()``; see _base.py and docs/patches.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from ._base import UNTESTED_ENV as UNTESTED_ENV  # defined beside the range check it governs
from ._base import Patch, PatchConfigError, env_allows_untested, env_flag

PATCH_MODULES = [
    "cpu_accelerator_api",  # torch.accelerator on CPU-only hosts (+ torch.compile)
    "cpu_accelerator_noops",  # vllm#41033 / vllm PR #49960: vLLM's aliased CPU no-ops
    "xpu_shutdown",  # vllm PR #46433: graceful XPU shutdown (< 0.25)
    "drain_deadline",  # a drain ends with a final event per request, never a stall
    "fast_exit",  # no multi-second final GC scan after vLLM's teardown
    "cpu_aot_compile",  # vllm PR #32037: no AOT artifact on CPU that fails to load every start
    "shm_busy_sleep",  # vllm PR #52848: shm queue readers sleep, not spin (under a CPU quota)
    "engine_parent_watch",  # vllm issue #55510: the engine core follows its dead parent
    "cpu_amx_tiles",  # AMX CPUs: the process may use AMX tiles before vLLM's AMX kernels run
]

ALLOW_ENV = "INTEL_VLLM_PATCHES"
DENY_ENV = "INTEL_VLLM_PATCHES_DISABLE"
STRICT_ENV = "INTEL_VLLM_PATCHES_STRICT"


def all_patches() -> list[Patch]:
    return [importlib.import_module(f"{__package__}.{m}").PATCH for m in PATCH_MODULES]


def _names(value: str | None) -> list[str] | None:
    if value is None or not value.strip():
        return None
    return [n.strip() for n in value.split(",") if n.strip()]


def select(env: Mapping[str, str]) -> tuple[list[Patch], list[Patch], PatchConfigError | None]:
    """(enabled, disabled, config error or None). Unknown names are reported, never applied;
    the known names in the lists still take effect (so a typo can't enable a denied patch)."""
    patches = all_patches()
    known = {p.name for p in patches}
    allow, deny = _names(env.get(ALLOW_ENV)), _names(env.get(DENY_ENV)) or []
    unknown = [n for n in (allow or []) + deny if n not in known]
    error = None
    if unknown:
        error = PatchConfigError(
            f"unknown patch name(s) {','.join(unknown)} in {ALLOW_ENV}/{DENY_ENV}; "
            f"known: {','.join(sorted(known))}"
        )
    enabled = [p for p in patches if (allow is None or p.name in allow) and p.name not in deny]
    return enabled, [p for p in patches if p not in enabled], error


def strict(env: Mapping[str, str]) -> bool:
    return env_flag(env, STRICT_ENV)


allow_untested = env_allows_untested
