"""A setattr guard on the ``torch.accelerator`` module, shared by the CPU accelerator patches.

Why a guard and not only a fix of the bound values: vLLM's CPU backend *re-binds*
``torch.accelerator.synchronize`` / ``empty_cache`` after plugins have loaded - at import of
``vllm/v1/worker/cpu/shm.py`` (module level) and in ``_set_torch_accelerator_to_noop()``, called from
``CPUModelRunner.__init__``. Patching those two binders by name would miss the next one vLLM adds,
and an import hook would still miss a function that re-binds at call time. Every binder, present
and future, ends in ``setattr(torch.accelerator, name, value)``, so that is where we intercept:
the module's class is switched to a ``ModuleType`` subclass whose ``__setattr__`` passes the value
through the active policies (``policy(name, value) -> value``). ``torch.accelerator`` stays a real
module (Dynamo checks ``isinstance(value, ModuleType)``); with no policy left the class is
switched back.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable

import torch

Policy = Callable[[str, object], object]
log = logging.getLogger("vllm.vllm_intel.patches")


class _GuardedModule(types.ModuleType):
    _policies: list[Policy] = []

    def __setattr__(self, name: str, value: object) -> None:
        for policy in type(self)._policies:
            value = policy(name, value)
        super().__setattr__(name, value)


def add_policy(policy: Policy) -> None:
    if policy not in _GuardedModule._policies:
        _GuardedModule._policies.append(policy)
    torch.accelerator.__class__ = _GuardedModule


def remove_policy(policy: Policy) -> None:
    if policy in _GuardedModule._policies:
        _GuardedModule._policies.remove(policy)
    if not _GuardedModule._policies and type(torch.accelerator) is _GuardedModule:
        torch.accelerator.__class__ = types.ModuleType


def set_unguarded(name: str, value: object) -> None:
    """Bind without running the policies (used by the patches themselves)."""
    vars(torch.accelerator)[name] = value
