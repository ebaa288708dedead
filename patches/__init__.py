"""vllm-intel runtime patches for vLLM on Intel CPUs and XPUs (import name ``vllm_intel.patches``).

``register()`` is the ``vllm.general_plugins`` entry point: vLLM calls it once in each of its
processes (API server, EngineCore, Worker). It applies the enabled patches and logs one line with
their states. It never raises into vLLM start-up unless ``INTEL_VLLM_PATCHES_STRICT=1``.

``main(argv)`` (``python -m vllm_intel.patches``) applies the patches in its own process and
prints one line per patch: name, state, reason. See docs/patches.md.

The names in ``__all__`` are the package's public surface (the supervisor uses no other):
``patch_names()`` and ``declarations()`` read the patches' sources and import none of them (nor
torch); ``busy_sleep_s()`` imports only its own patch module.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import time

from vllm_intel.in_vllm import run_files, startup_phases

from . import registry
from ._base import (
    APPLIED,
    DISABLED,
    FAILED,
    NOT_APPLICABLE,
    UNTESTED,
    UPSTREAM,
    Patch,
    PatchConfigError,
    PatchFailedError,
    vllm_version,
)
from .registry import Declared

__all__ = [
    "register",
    "main",
    "USAGE",
    "apply_all",
    "patch_names",
    "declarations",
    "Declared",
    "named_in",
    "busy_sleep_s",
    "vllm_version",
    "PatchConfigError",
    "PatchFailedError",
    "APPLIED",
    "UPSTREAM",
    "NOT_APPLICABLE",
    "FAILED",
    "DISABLED",
    "UNTESTED",
]

# A child of vLLM's logger, so the line gets vLLM's format and "(EngineCore pid=..)" prefix.
log = logging.getLogger("vllm.vllm_intel.patches")
_registered_pid: int | None = None


def _emit(level: int, msg: str, *args) -> None:
    """Log through vLLM's logger; vLLM 0.32 configures logging lazily (from the CLI args), so the
    API server may load plugins before any handler exists - then write the line to stderr."""
    if log.hasHandlers():
        log.log(level, msg, *args)
    elif level >= logging.INFO:
        print(
            f"{logging.getLevelName(level)} {time.strftime('%m-%d %H:%M:%S')} "
            f"[vllm_intel.patches] {msg % args}",
            file=sys.stderr,
            flush=True,
        )


def process_kind() -> str:
    """API server / EngineCore / Worker, from the multiprocessing name vLLM gives its processes
    ("EngineCore", "EngineCore_DP<n>", "VllmWorker-<rank>"); anything else is the main process."""
    name = multiprocessing.current_process().name
    if name.startswith("EngineCore"):
        return name.replace("_", " ") if name != "EngineCore" else "EngineCore"
    if "Worker" in name:
        return "Worker"
    return "API server" if name == "MainProcess" else name


def apply_all(env=os.environ) -> tuple[list[Patch], PatchConfigError | None]:
    """Apply the selected patches in this process (idempotent); returns every patch + config error."""
    enabled, disabled, error = registry.select(env)
    for p in disabled:
        p.disable()
    untested_ok = registry.allow_untested(env)
    for p in enabled:
        p.apply(untested_ok)
    return enabled + disabled, error


def patch_names() -> list[str]:
    """Every patch's name, in apply order, from the modules' sources (imports no patch)."""
    return [d.name for d in registry.declarations()]


def declarations() -> list[Declared]:
    """Every patch's declarations (name, order, summary, targets, tested, lifecycle, upstream,
    fixed_in, platform, condition), in apply order, from the modules' sources (imports no patch)."""
    return registry.declarations()


def named_in(env) -> dict[str, list[str]]:
    """The patch names each of INTEL_VLLM_PATCHES and INTEL_VLLM_PATCHES_DISABLE lists in ``env``
    (``[]`` when unset or blank), by variable."""
    return {
        var: registry._names(env.get(var)) or [] for var in (registry.ALLOW_ENV, registry.DENY_ENV)
    }


def busy_sleep_s(env=os.environ) -> float:
    """VLLM_SHM_BROADCAST_BUSY_SLEEP_S as shm-busy-sleep reads it (0 when unset); ValueError, one
    line, for a value it refuses."""
    from .shm_busy_sleep import busy_sleep_s as read

    return read(env)


def _order(patches: list[Patch]) -> list[Patch]:
    pos = {n: i for i, n in enumerate(p.name for p in registry.all_patches())}
    return sorted(patches, key=lambda p: pos[p.name])


def _failure(patches: list[Patch]) -> PatchFailedError | None:
    failed = [p for p in patches if p.state == FAILED]
    if not failed:
        return None
    return PatchFailedError(
        "; ".join(f"vllm-intel patch {p.name} failed: {p.reason}" for p in failed)
        + f" ({registry.STRICT_ENV}=1)"
    )


def _write_states(patches: list[Patch]) -> None:
    """This process's patch states, for the supervisor's /metrics (best effort: never fails)."""
    where = run_files.own(run_files.PATCH_STATES)
    if where:
        data = {"process": process_kind(), "states": {p.name: p.state for p in patches}}
        run_files.write(where, data)


def register() -> None:
    """vLLM general plugin entry point (once per process)."""
    global _registered_pid
    if _registered_pid == os.getpid():
        return
    _registered_pid = os.getpid()  # per pid: a forked child inherits this module's state
    try:
        startup_phases.install(process_kind)
    except Exception as exc:  # only an observer: the patches go on without it
        _emit(logging.WARNING, "vllm-intel: start-up phases not recorded: %s", exc)
    strict = registry.strict(os.environ)
    try:
        patches, error = apply_all()
    except Exception as exc:  # a bug here must not take vLLM down (unless strict)
        if strict:
            raise
        _emit(logging.ERROR, "vllm-intel patches: not applied: %s: %s", type(exc).__name__, exc)
        return
    if error is not None:
        if strict:
            raise error
        _emit(logging.ERROR, "vllm-intel patches: %s", error)
    _emit(
        logging.INFO,
        "vllm-intel patches (pid %d, %s): %s",
        os.getpid(),
        process_kind(),
        " ".join(f"{p.name}={p.state}" for p in _order(patches)),
    )
    _write_states(patches)
    for p in patches:
        if p.state == FAILED and not strict:
            _emit(logging.WARNING, "vllm-intel patch %s failed: %s", p.name, p.reason)
    if strict and (failure := _failure(patches)) is not None:
        raise failure


USAGE = "usage: python -m vllm_intel.patches [--strict]"


def main(argv: list[str] | None = None) -> int:
    """Apply in this process and print one line per patch. 0 ok, 64 config error, 1 strict failure."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    strict = registry.strict(os.environ)
    for arg in argv:
        if arg != "--strict":
            print(f"vllm-intel patches: unknown argument {arg!r}; {USAGE}", file=sys.stderr)
            return 64
        strict = True
    try:
        enabled, disabled, error = registry.select(os.environ)
    except Exception as exc:
        print(f"vllm-intel patches: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if error is not None:
        print(f"vllm-intel patches: {error}", file=sys.stderr)
        return 64
    patches, _ = apply_all()
    width = max(len(p.name) for p in patches)
    for p in _order(patches):
        name, state, reason = p.status()
        print(f"{name:<{width}}  {state:<14}  {reason}".rstrip())
    if strict and (failure := _failure(patches)) is not None:
        print(f"vllm-intel patches: {failure}", file=sys.stderr)
        return 1
    return 0
