"""The patches, found: every module of this package that assigns ``PATCH = <Patch subclass>()``
(not ``_private`` ones, nor this module, ``tested_code``, ``__main__``, ``__init__``), in the order
their classes declare (``Patch.order``); and the env-var selection.

Adding a patch is adding its module (see _base.py and docs/patches.md): nothing here names it.
Names and declarations come from the modules' sources, so knowing them imports no patch (the
modules import torch and vLLM).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import pathlib
from collections.abc import Mapping

from ._base import Patch, PatchConfigError
from ._release_gate import UNTESTED_ENV as UNTESTED_ENV  # defined beside the range check it governs
from ._release_gate import env_allows_untested, env_flag, recorded, tested_range

NOT_PATCHES = ("registry", "tested_code")  # besides _private modules, __init__ and __main__


@dataclasses.dataclass(frozen=True)
class Declared:
    """A patch's declarations (Patch's class attributes of the same names), read from its
    module's source; unset ones have Patch's defaults. ``tested`` is not declared: its range from
    its record (tested_code.py), as ``Patch.tested``."""

    module: str  # the module's name in this package, e.g. "fast_exit"
    name: str
    order: int
    summary: str = Patch.summary
    targets: tuple[str, ...] = Patch.targets
    tested: str = ""
    lifecycle: bool = Patch.lifecycle
    upstream: str = Patch.upstream
    fixed_in: str = Patch.fixed_in
    platform: str = Patch.platform
    condition: str = Patch.condition


DECLARED = tuple(f.name for f in dataclasses.fields(Declared) if f.name not in ("module", "tested"))


def _name_of(node: ast.AST | None) -> str | None:
    return node.id if isinstance(node, ast.Name) else None


def _assigned(item: ast.stmt) -> tuple[str | None, ast.expr | None]:
    """(name, value) of ``name = value`` or ``name: type = value``, else (None, None)."""
    if isinstance(item, ast.Assign) and len(item.targets) == 1:
        return _name_of(item.targets[0]), item.value
    if isinstance(item, ast.AnnAssign):
        return _name_of(item.target), item.value
    return None, None


def _patch_class(tree: ast.Module) -> ast.ClassDef | None:
    """The class of the module's top-level ``PATCH = Class()``; None without a PATCH."""
    for node in tree.body:
        name, value = _assigned(node)
        if name == "PATCH":
            cls = _name_of(value.func) if isinstance(value, ast.Call) else None
            for found in tree.body:
                if isinstance(found, ast.ClassDef) and found.name == cls:
                    return found
            raise ValueError("PATCH is not an instance of a class defined in its module")
    return None


def read_declarations(path: pathlib.Path) -> Declared | None:
    """The declarations of the patch a module's source defines; None when it defines no PATCH.
    ValueError when a declaration is not a literal, or ``name`` or ``order`` is missing."""
    try:
        cls = _patch_class(ast.parse(path.read_text(encoding="utf-8")))
    except ValueError as exc:
        raise ValueError(f"{path.name}: {exc}") from None
    if cls is None:
        return None
    found = {}
    for item in cls.body:
        attr, value = _assigned(item)
        if attr == "tested":
            raise ValueError(
                f"{path.name}: {cls.name}.tested is its record's (tested_code.py), not declared"
            )
        if attr in DECLARED and value is not None:
            try:
                found[attr] = ast.literal_eval(value)
            except ValueError:
                raise ValueError(f"{path.name}: {cls.name}.{attr} is not a literal") from None
    missing = [a for a in ("name", "order") if a not in found]
    if missing:
        raise ValueError(f"{path.name}: {cls.name} declares no {' and no '.join(missing)}")
    return Declared(module=path.stem, tested=tested_range(recorded(found["name"])), **found)


@functools.cache
def _declarations(where: str) -> tuple[Declared, ...]:
    found = []
    for path in sorted(pathlib.Path(where).glob("*.py")):
        if path.stem.startswith("_") or path.stem in NOT_PATCHES:
            continue
        if (declared := read_declarations(path)) is not None:
            found.append(declared)
    return tuple(sorted(found, key=lambda d: (d.order, d.module)))


def declarations() -> list[Declared]:
    """Every patch's declarations, in apply order (a package's modules do not change under it)."""
    return list(_declarations(str(pathlib.Path(__file__).parent)))


def modules() -> list[str]:
    """The patch modules, in apply order."""
    return [d.module for d in declarations()]


ALLOW_ENV = "INTEL_VLLM_PATCHES"
DENY_ENV = "INTEL_VLLM_PATCHES_DISABLE"
STRICT_ENV = "INTEL_VLLM_PATCHES_STRICT"


def all_patches() -> list[Patch]:
    return [importlib.import_module(f"{__package__}.{m}").PATCH for m in modules()]


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
