"""The patch protocol shared by every module in this package.

A patch is one module of this package that ends with ``PATCH = <Patch subclass>()``; the registry
finds it there (registry.py). Its class declares, as literals in its own body (the registry reads
them from the source, without importing the module):

* ``name``      stable, user-facing name (used in ``INTEL_VLLM_PATCHES*`` and in the log line);
* ``order``     its place in the apply order (ascending; distinct among the patches);
* ``summary``   what it fixes, one line (the README's patch table);
* ``targets``   the code it changes or relies on, ``"module:Qual.name"`` (``"module"``: the whole
  module); their AST fingerprints on each release it was tested on are its record in
  ``tested_code.py`` (generated; ``tools/upstream_release.py record --add NAME RELEASE`` adds a
  release), whose releases are the one list of where it was tested: ``tested``, its range
  (``">=0.27.1,<=0.32.0"``), and the releases its tests run it on derive from it; on code no
  recorded release has the gate holds it back (_release_gate.py);
* ``upstream``  the upstream pull request or issue of the fix ("" none);
* ``fixed_in``  the oldest vLLM release known to carry that fix: ``check()`` says ``upstream``
  there and after ("" none known);
* ``platform``  the vLLM platform whose code it fixes, "cpu" or "xpu" ("" every platform):
  elsewhere ``check()`` says ``not-applicable``;
* ``condition`` what decides besides the release and the platform ("" nothing): the host, the
  process or a setting the supervisor makes;

and implements:

* ``check()``   decides by inspecting the running code and platform whether the patch is needed;
  returns ``(NEEDED, why)`` or ``(UPSTREAM | NOT_APPLICABLE, why)``;
* ``apply()``   idempotent; asks the release gate, runs ``check()`` and, when needed, ``_apply()``;
  never raises (a failure becomes state ``failed`` with its reason);
* ``revert()``  restores every attribute ``_apply()`` replaced, in reverse order;
* ``status()``  ``(name, state, reason)``.

What ``check()`` reads the installed code with: _code_shape.py.
"""

from __future__ import annotations

import os

from ._release_gate import (
    UNTESTED_ENV,
    Gate,
    annotated,
    decide,
    env_allows_untested,
    recorded,
    tested_range,
    vllm_version,
)

APPLIED = "applied"  # this process now runs the patched code
UPSTREAM = "upstream"  # the installed code already carries the fix
NOT_APPLICABLE = "not-applicable"  # the fix is not needed on this platform / installation
FAILED = "failed"  # needed, but applying it raised (reason says why)
DISABLED = "disabled"  # left out by INTEL_VLLM_PATCHES / INTEL_VLLM_PATCHES_DISABLE
UNTESTED = "untested"  # the installed vLLM's targets are no tested release's code (not applied)
NEEDED = "needed"  # check() only: apply() would change something
PENDING = "pending"  # not applied/checked yet in this process

_MISSING = object()


class PatchConfigError(ValueError):
    """Bad INTEL_VLLM_PATCHES / INTEL_VLLM_PATCHES_DISABLE value (one-line message)."""


class PatchFailedError(RuntimeError):
    """Strict mode (INTEL_VLLM_PATCHES_STRICT=1): a needed patch could not be applied."""


class Patch:
    name: str = ""
    summary: str = ""  # what it fixes, one line
    targets: tuple[str, ...] = ()  # "module:Qual.name" or "module": the code it changes or reads
    order: int = 0  # apply order, ascending; each patch declares its own, distinct
    lifecycle: bool = False  # a process-lifecycle patch: applied outside its range too
    upstream: str = ""  # the upstream pull request or issue of the fix
    fixed_in: str = ""  # the oldest vLLM release known to carry that fix
    platform: str = ""  # "cpu" or "xpu": the platform whose code it fixes ("": every platform)
    condition: str = ""  # what else decides whether it applies (the host, the process, a setting)

    def __init__(self) -> None:
        self.state = PENDING
        self.reason = ""
        self._saved: list[tuple[object, str, object]] = []

    @property
    def tested(self) -> str:
        """Its tested range, from its record (``">=0.27.1,<=0.32.0"``; "" none recorded)."""
        return tested_range(recorded(self.name))

    # -- to implement -----------------------------------------------------------------------
    def check(self) -> tuple[str, str]:
        raise NotImplementedError

    def _apply(self) -> str | None:
        """Make the change (using _replace); may return a reason to show instead of check()'s."""
        raise NotImplementedError

    # -- shared behaviour -------------------------------------------------------------------
    def apply(self, allow_untested: bool | None = None) -> str:
        """``allow_untested`` None: read ``INTEL_VLLM_PATCHES_UNTESTED`` from the environment."""
        if self.state == APPLIED:
            return self.state
        if allow_untested is None:
            allow_untested = env_allows_untested(os.environ)
        try:
            version = vllm_version()
            gate, why = decide(self, version, allow_untested, in_range=False)
            try:
                state, reason = self.check()
            except Exception:
                gate, why = decide(self, version, allow_untested)
                if gate in (Gate.TESTED, Gate.SAME_CODE):
                    raise
                # code the patch has never met: that, not the error, is the news
                self.state, self.reason = UNTESTED, f"{why} (its check failed there)"
                return self.state
            if state == NEEDED:  # in the range too, the code decides
                gate, why = decide(self, version, allow_untested)
            if state == NEEDED and gate is Gate.HELD:
                self.state, self.reason = UNTESTED, f"{why} ({UNTESTED_ENV}=1 applies it anyway)"
                return self.state
            if state == NEEDED:
                reason, state = self._apply() or reason, APPLIED
            reason = annotated(gate, why, reason, state == APPLIED)
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
