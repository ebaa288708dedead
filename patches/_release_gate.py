"""Release gating: whether the installed vLLM runs code a patch was tested on, decided once per
apply.

A patch's record (tested_code.py, generated) holds the AST fingerprint of each of its targets on
each release it was tested on; those releases are its tested range, ``">=lowest,<=highest"``
(``tested_range``), compared with the installed vLLM's version without its local suffix
(``0.32.0+cpu`` -> ``0.32.0``) only to word the reason. In the range and outside it alike, a patch
that ``check()`` finds needed is applied only where every target is the code of a recorded
release (same fingerprint; an absent target is ``None``, a value like any other); otherwise it is
left out (state ``untested``, the reason names the targets that changed) unless
``INTEL_VLLM_PATCHES_UNTESTED=1``; ``lifecycle`` patches (process exit and the like) are never
left out for it, their reason only says so. Where nothing can be compared the range alone
decides: a patch without targets; and without vLLM, or without a record, nothing is checked.
``upstream`` and ``not-applicable`` verdicts stand on every release: ``check()`` only reads.
"""

from __future__ import annotations

import ast
import enum
import importlib.util
import os
import sys
from collections.abc import Iterable

from ._code_shape import fingerprints, module_source, source_digest

UNTESTED_ENV = "INTEL_VLLM_PATCHES_UNTESTED"  # =1: apply patches outside their tested range


class Gate(enum.Enum):
    """The installed release's word on one patch, before its check()."""

    TESTED = "tested"  # in the range, the code a tested release's (or no record, or no vLLM)
    SAME_CODE = "same code"  # outside the range; every target is a tested release's code
    LIFECYCLE = "lifecycle"  # untested; a lifecycle patch applies anyway
    OPTED_IN = "opted in"  # untested; INTEL_VLLM_PATCHES_UNTESTED=1 applies it anyway
    HELD = "held"  # untested; a needed patch is not applied


def env_flag(env, name: str) -> bool:
    return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def env_allows_untested(env) -> bool:
    """INTEL_VLLM_PATCHES_UNTESTED=1: a patch outside its tested vLLM range applies anyway."""
    return env_flag(env, UNTESTED_ENV)


def recorded(name: str) -> dict[str, dict[str, str | None]]:
    """A patch's record, ``{release: {target: fingerprint}}`` (tested_code.py; {} none): its keys
    are the releases it was tested on."""
    from .tested_code import TESTED

    return TESTED.get(name, {})


def tested_range(releases: Iterable[str]) -> str:
    """``">=lowest,<=highest"`` of ``releases`` ("" for none): a patch's range, from its record."""
    ordered = sorted(releases, key=release_key)
    return f">={ordered[0]},<={ordered[-1]}" if ordered else ""


def decide(patch, version: str | None, allow: bool, in_range: bool = True) -> tuple[Gate, str]:
    """(the gate, why): for an untested gate why the installed vLLM is untested, for SAME_CODE
    which tested release's code it runs. ``patch`` declares ``name``, ``targets``,
    ``lifecycle``; ``version`` is vllm_version()'s; ``allow``: the untested opt-in;
    ``in_range`` False: TESTED in the range without reading the code (apply() asks again, with
    it, where the gate decides: check() found the patch needed, or raised)."""
    record = recorded(patch.name)
    if version is None or not record:
        return Gate.TESTED, ""
    tested = tested_range(record)
    why = outside(version, tested)
    if why is None and not in_range:
        return Gate.TESTED, ""
    if patch.targets:
        public = version_public(version)
        same, changed = matching_release(record, patch.targets, public)
        if same:
            if why is None:
                return Gate.TESTED, ""
            return Gate.SAME_CODE, f"vLLM {version}: its code is {same}'s, tested"
        against = public if public in record else max(record, key=release_key)
        if why is None:
            why = f"vLLM {public} is in the tested range {tested}, not its code"
        why = f"{why}; changed since {against}: {', '.join(changed)}"
    elif why is None:
        return Gate.TESTED, ""
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


def matching_release(
    record: dict, targets: Iterable[str], against: str | None = None
) -> tuple[str | None, list[str]]:
    """(the newest recorded release whose targets' code the installed one is, or None; the
    targets that differ from release ``against``'s where it is recorded, else from the newest
    recorded release's), by AST fingerprint. ``record``: a patch's ``recorded()``."""
    newest_first = sorted(record, key=release_key, reverse=True)
    same = same_text(newest_first, {t.partition(":")[0] for t in targets})
    if same:
        return same, []
    installed = fingerprints(targets)
    for release in newest_first:
        if all(installed.get(t) == fp for t, fp in record[release].items()):
            return release, []
    ref = record[against if against in record else max(record, key=release_key)]
    return None, [t for t in targets if installed.get(t) != ref.get(t)]


def same_text(releases: list[str], modules: set[str]) -> str | None:
    """The first of ``releases`` whose recorded text of every module in ``modules`` the installed
    modules have (tested_code.SOURCES), or None: then the fingerprints decide."""
    from .tested_code import SOURCES

    digests: dict[str, str | None] = {}
    for release in releases:
        texts = SOURCES.get(release, {})
        if not modules <= texts.keys():
            continue
        for module in modules - digests.keys():
            digests[module] = source_digest(module_source(module))
        if all(digests[m] == texts[m] for m in modules):
            return release
    return None


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


def release_key(release: str) -> tuple[int, ...]:
    """The sort key of a recorded release, a final release number ("0.32.0": the record holds no
    other, tools/upstream_release.py refuses them), without ``packaging``: the supervisor reads a
    patch's range on the standard library alone."""
    return tuple(int(part) for part in release.split("."))


def version_public(version: str) -> str | None:
    """``version`` without its local suffix (None: not a PEP 440 version)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).public
    except InvalidVersion:
        return None


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
