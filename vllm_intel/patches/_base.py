"""The patch protocol shared by every module in this package.

A patch is one object (module attribute ``PATCH``) with:

* ``name``      stable, user-facing name (used in ``INTEL_VLLM_PATCHES*`` and in the log line);
* ``check()``   decides by inspecting the running code and platform whether the patch is needed;
  returns ``(NEEDED, why)`` or ``(UPSTREAM | NOT_APPLICABLE, why)``;
* ``apply()``   idempotent; runs ``check()`` and, when needed, ``_apply()``; never raises
  (a failure becomes state ``failed`` with its reason);
* ``revert()``  restores every attribute ``_apply()`` replaced, in reverse order;
* ``status()``  ``(name, state, reason)``.
"""

from __future__ import annotations

import importlib.util

APPLIED = "applied"  # this process now runs the patched code
UPSTREAM = "upstream"  # the installed code already carries the fix
NOT_APPLICABLE = "not-applicable"  # the fix is not needed on this platform / installation
FAILED = "failed"  # needed, but applying it raised (reason says why)
DISABLED = "disabled"  # left out by INTEL_VLLM_PATCHES / INTEL_VLLM_PATCHES_DISABLE
NEEDED = "needed"  # check() only: apply() would change something
PENDING = "pending"  # not applied/checked yet in this process

_MISSING = object()


class PatchConfigError(ValueError):
    """Bad INTEL_VLLM_PATCHES / INTEL_VLLM_PATCHES_DISABLE value (one-line message)."""


class PatchFailedError(RuntimeError):
    """Strict mode (INTEL_VLLM_PATCHES_STRICT=1): a needed patch could not be applied."""


class Patch:
    name: str = ""

    def __init__(self) -> None:
        self.state = PENDING
        self.reason = ""
        self._saved: list[tuple[object, str, object]] = []

    # -- to implement -----------------------------------------------------------------------
    def check(self) -> tuple[str, str]:
        raise NotImplementedError

    def _apply(self) -> str | None:
        """Make the change (using _replace); may return a reason to show instead of check()'s."""
        raise NotImplementedError

    # -- shared behaviour -------------------------------------------------------------------
    def apply(self) -> str:
        if self.state == APPLIED:
            return self.state
        try:
            state, reason = self.check()
            if state == NEEDED:
                reason = self._apply() or reason
                state = APPLIED
        except Exception as exc:  # a patch must never break vLLM start-up by itself
            self.revert()
            state, reason = FAILED, f"{type(exc).__name__}: {exc}".splitlines()[0]
        self.state, self.reason = state, reason
        return state

    def revert(self) -> None:
        while self._saved:
            obj, attr, old = self._saved.pop()
            if isinstance(obj, dict):  # from _replace_item
                if old is _MISSING:
                    obj.pop(attr, None)
                else:
                    obj[attr] = old
            elif old is _MISSING:
                try:
                    delattr(obj, attr)
                except AttributeError:
                    pass
            else:
                setattr(obj, attr, old)
        if self.state == APPLIED:
            self.state, self.reason = PENDING, "reverted"

    def status(self) -> tuple[str, str, str]:
        return self.name, self.state, self.reason

    def disable(self) -> None:
        self.state, self.reason = DISABLED, "deny-listed by INTEL_VLLM_PATCHES(_DISABLE)"

    # -- helpers for _apply() ---------------------------------------------------------------
    def _replace(self, obj: object, attr: str, value: object) -> None:
        """setattr that remembers the original (own attribute or absent) for revert()."""
        self._saved.append(
            (
                obj,
                attr,
                vars(obj).get(attr, _MISSING)
                if hasattr(obj, "__dict__")
                else getattr(obj, attr, _MISSING),
            )
        )
        setattr(obj, attr, value)

    def _replace_item(self, table: dict, key: str, value: object) -> None:
        """table[key] = value, remembering the original for revert()."""
        self._saved.append((table, key, table.get(key, _MISSING)))
        table[key] = value


def module_source(modname: str) -> str | None:
    """Source text of an installed module without importing it (None if absent).

    Lets check() inspect vLLM's code in the API server process without paying for (or
    triggering side effects of) importing worker modules.
    """
    try:
        spec = importlib.util.find_spec(modname)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    with open(spec.origin, encoding="utf-8") as fh:
        return fh.read()


def code_source(modname: str, qualname: str) -> str | None:
    """Source of an installed function, e.g. ("vllm.v1.engine.core", "EngineCoreProc.run_engine_core");
    None when the module or the attribute does not exist (a release without that code)."""
    import importlib
    import inspect

    try:
        obj = importlib.import_module(modname)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return inspect.getsource(obj)
    except (ImportError, AttributeError, OSError, TypeError):
        return None
