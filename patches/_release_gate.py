"""Release gating: whether the installed vLLM is one a patch was tested on, decided once per apply.

A patch declares ``tested``, a PEP 440 specifier of the vLLM releases its tests run it on,
compared with the installed vLLM's version without its local suffix (``0.32.0+cpu`` ->
``0.32.0``). Outside it, a patch that ``check()`` finds needed is applied only where every target
is the code of a tested release (same AST fingerprint, tested_code.py); otherwise it is left out
(state ``untested``, the reason names the targets that changed) unless
``INTEL_VLLM_PATCHES_UNTESTED=1``; ``lifecycle`` patches (process exit and the like) are never
left out for it, their reason only says so. ``upstream`` and ``not-applicable`` verdicts stand on
every release: ``check()`` only reads.
"""

from __future__ import annotations

import ast
import enum
import importlib.util
import os
import sys
from collections.abc import Iterable

from ._code_shape import fingerprint

UNTESTED_ENV = "INTEL_VLLM_PATCHES_UNTESTED"  # =1: apply patches outside their tested range


class Gate(enum.Enum):
    """The installed release's word on one patch, before its check()."""

    TESTED = "tested"  # in the range (or no range declared, or no vLLM)
    SAME_CODE = "same code"  # outside the range; every target is a tested release's code
    LIFECYCLE = "lifecycle"  # untested; a lifecycle patch applies anyway
    OPTED_IN = "opted in"  # untested; INTEL_VLLM_PATCHES_UNTESTED=1 applies it anyway
    HELD = "held"  # untested; a needed patch is not applied


def env_flag(env, name: str) -> bool:
    return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def env_allows_untested(env) -> bool:
    """INTEL_VLLM_PATCHES_UNTESTED=1: a patch outside its tested vLLM range applies anyway."""
    return env_flag(env, UNTESTED_ENV)


def decide(patch, version: str | None, allow: bool) -> tuple[Gate, str]:
    """(the gate, why): for an untested gate why the installed vLLM is untested, for SAME_CODE
    which tested release's code it runs. ``patch`` declares ``name``, ``targets``, ``tested``,
    ``lifecycle``; ``version`` is vllm_version()'s; ``allow``: the untested opt-in."""
    why = outside(version, patch.tested) if patch.tested and version is not None else None
    if why is None:
        return Gate.TESTED, ""
    from .tested_code import TESTED

    record = TESTED.get(patch.name, {})
    if record:  # something recorded to compare with
        same, changed = matching_release(record, patch.targets)
        if same:
            return Gate.SAME_CODE, f"vLLM {version}: its code is {same}'s, tested"
        why = f"{why}; changed since {max(record, key=version_key)}: {', '.join(changed)}"
    if patch.lifecycle:
        return Gate.LIFECYCLE, why
    return (Gate.OPTED_IN if allow else Gate.HELD), why


def annotated(gate: Gate, why: str, reason: str, applied: bool) -> str:
    """check()'s (or _apply()'s) reason with what the gate adds to it."""
    if gate is Gate.SAME_CODE:
        return f"{reason} ({why})"
    if applied and gate is Gate.LIFECYCLE:
        return f"{reason} (untested: {why}; lifecycle patch)"
    if applied and gate is Gate.OPTED_IN:
        return f"{reason} (untested: {why}; {UNTESTED_ENV}=1)"
    return reason


def matching_release(record: dict, targets: Iterable[str]) -> tuple[str | None, list[str]]:
    """(the newest recorded release whose targets' code the installed one is, or None; the
    targets that differ from the newest recorded release's), by AST fingerprint. ``record``:
    ``{release: {target: fingerprint}}``, a patch's entry of tested_code.TESTED."""
    installed = {t: fingerprint(t) for t in targets}
    for release in sorted(record, key=version_key, reverse=True):
        if all(installed.get(t) == fp for t, fp in record[release].items()):
            return release, []
    newest = record[max(record, key=version_key)]
    return None, [t for t in targets if installed.get(t) != newest.get(t)]


def vllm_version() -> str | None:
    """The version of the vLLM this process imports (None: no vLLM), without importing it: the
    imported module's ``__version__`` or the ``__version__`` assigned in its ``_version.py``
    (the wheel's and the sdist's; a vLLM on ``PYTHONPATH`` counts, not the installed dist);
    "unknown" when neither says."""
    mod = sys.modules.get("vllm")
    version = getattr(mod, "__version__", None) if mod is not None else None
    if isinstance(version, str) and version != "dev":
        return version
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for where in spec.submodule_search_locations or []:
        try:
            with open(os.path.join(where, "_version.py"), encoding="utf-8") as fh:
                tree = ast.parse(fh.read())
        except (OSError, SyntaxError, ValueError):
            continue
        for node in tree.body:  # ``__version__ = version = '0.32.0'`` (setuptools-scm)
            if (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                return node.value.value
    return "unknown"


def version_key(version: str):
    from packaging.version import Version

    return Version(version)


def outside(version: str, tested: str) -> str | None:
    """None when ``version`` (its local suffix dropped) is in the specifier ``tested``."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        public = Version(version).public
    except InvalidVersion:
        return f"vLLM {version} (not a PEP 440 version) is outside the tested range {tested}"
    if SpecifierSet(tested).contains(public, prereleases=True):
        return None
    return f"vLLM {public} is outside the tested range {tested}"
