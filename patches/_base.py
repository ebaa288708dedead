"""The patch protocol shared by every module in this package.

A patch is one module of this package that ends with ``PATCH = <Patch subclass>()``; the registry
finds it there (registry.py). Its class declares, as literals in its own body (the registry reads
them from the source, without importing the module):

* ``name``      stable, user-facing name (used in ``INTEL_VLLM_PATCHES*`` and in the log line);
* ``order``     its place in the apply order (ascending; distinct among the patches);
* ``summary``   what it fixes, one line (the README's patch table);
* ``targets``   the code it changes or relies on, ``"module:Qual.name"`` (``"module"``: the whole
  module); their AST fingerprints on each tested release are recorded in ``tested_code.py``;
* ``tested``    the vLLM releases the patch was tested on, a PEP 440 specifier
  (``">=0.27.1,<=0.32.0"``), compared with the installed vLLM's version without its local
  suffix (``0.32.0+cpu`` -> ``0.32.0``). Outside it a patch that ``check()`` finds needed is
  applied only where every target is the code of a tested release (same AST fingerprint);
  otherwise it is left out (state ``untested``, the reason names the targets that changed)
  unless ``INTEL_VLLM_PATCHES_UNTESTED=1``; ``lifecycle`` patches (process exit and the like)
  are never left out for it, their reason only says so. ``upstream`` and ``not-applicable``
  verdicts stand on every release: ``check()`` only reads;
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
* ``apply()``   idempotent; runs ``check()``, checks ``tested`` and, when needed, ``_apply()``;
  never raises (a failure becomes state ``failed`` with its reason);
* ``revert()``  restores every attribute ``_apply()`` replaced, in reverse order;
* ``status()``  ``(name, state, reason)``.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import os
import sys
import textwrap
from collections.abc import Iterator

APPLIED = "applied"  # this process now runs the patched code
UPSTREAM = "upstream"  # the installed code already carries the fix
NOT_APPLICABLE = "not-applicable"  # the fix is not needed on this platform / installation
FAILED = "failed"  # needed, but applying it raised (reason says why)
DISABLED = "disabled"  # left out by INTEL_VLLM_PATCHES / INTEL_VLLM_PATCHES_DISABLE
UNTESTED = "untested"  # the installed vLLM is outside the patch's tested range (not applied)
NEEDED = "needed"  # check() only: apply() would change something
PENDING = "pending"  # not applied/checked yet in this process

UNTESTED_ENV = "INTEL_VLLM_PATCHES_UNTESTED"  # =1: apply patches outside their tested range
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
    tested: str = ""  # PEP 440 specifier of the vLLM releases the tests run this patch on
    lifecycle: bool = False  # a process-lifecycle patch: applied outside its range too
    upstream: str = ""  # the upstream pull request or issue of the fix
    fixed_in: str = ""  # the oldest vLLM release known to carry that fix
    platform: str = ""  # "cpu" or "xpu": the platform whose code it fixes ("": every platform)
    condition: str = ""  # what else decides whether it applies (the host, the process, a setting)

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
    def outside_range(self) -> str | None:
        """None when the installed vLLM is in ``tested`` (or there is no vLLM, or no range);
        otherwise why not, e.g. "vLLM 0.33.0 is outside the tested range >=0.27.1,<=0.32.0"."""
        if not self.tested:
            return None
        version = vllm_version()
        if version is None:
            return None
        return outside(version, self.tested)

    def tested_code(self) -> tuple[str | None, list[str]]:
        """(the tested release whose targets' code the installed one is, or None; the targets
        that differ from the newest tested release's), by AST fingerprint (tested_code.py)."""
        from .tested_code import TESTED

        record = TESTED.get(self.name, {})
        if not record:
            return None, list(self.targets)
        installed = {t: fingerprint(t) for t in self.targets}
        for release in sorted(record, key=_version_key, reverse=True):
            if all(installed.get(t) == fp for t, fp in record[release].items()):
                return release, []
        newest = record[max(record, key=_version_key)]
        return None, [t for t in self.targets if installed.get(t) != newest.get(t)]

    def _untested(self) -> tuple[str | None, str]:
        """(why the installed vLLM is untested for this patch or None, a note for the reason)."""
        untested = self.outside_range()
        if not untested:
            return None, ""
        releases = _tested_releases(self.name)
        if not releases:  # nothing recorded to compare with
            return untested, ""
        same, changed = self.tested_code()
        if same:
            return None, f"vLLM {vllm_version()}: its code is {same}'s, tested"
        newest = max(releases, key=_version_key)
        return f"{untested}; changed since {newest}: {', '.join(changed)}", ""

    def apply(self, allow_untested: bool | None = None) -> str:
        """``allow_untested`` None: read ``INTEL_VLLM_PATCHES_UNTESTED`` from the environment."""
        if self.state == APPLIED:
            return self.state
        try:
            untested, note = self._untested()
            try:
                state, reason = self.check()
            except Exception:
                if untested:  # code the patch has never met: that, not the error, is the news
                    self.state, self.reason = UNTESTED, f"{untested} (its check failed there)"
                    return self.state
                raise
            if state == NEEDED and untested and not self.lifecycle:
                if allow_untested is None:
                    allow_untested = env_allows_untested(os.environ)
                if not allow_untested:
                    self.state = UNTESTED
                    self.reason = f"{untested} ({UNTESTED_ENV}=1 applies it anyway)"
                    return self.state
            if state == NEEDED:
                reason = self._apply() or reason
                state = APPLIED
            if untested and state == APPLIED:
                why = "lifecycle patch" if self.lifecycle else f"{UNTESTED_ENV}=1"
                reason = f"{reason} (untested: {untested}; {why})"
            elif note:
                reason = f"{reason} ({note})"
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


def env_flag(env, name: str) -> bool:
    return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def env_allows_untested(env) -> bool:
    """INTEL_VLLM_PATCHES_UNTESTED=1: a patch outside its tested vLLM range applies anyway."""
    return env_flag(env, UNTESTED_ENV)


# -- the tested range ------------------------------------------------------------------------------


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


def _version_key(version: str):
    from packaging.version import Version

    return Version(version)


def _tested_releases(name: str) -> list[str]:
    from .tested_code import TESTED

    return list(TESTED.get(name, {}))


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


# -- structure of installed code: AST, never the words in it -------------------------------------


def parse(src: str) -> ast.Module:
    """The AST of a function's or module's source (dedented: a method's source is indented)."""
    return ast.parse(textwrap.dedent(src))


def module_tree(modname: str) -> ast.Module | None:
    src = module_source(modname)
    return None if src is None else ast.parse(src)


def code_tree(modname: str, qualname: str) -> ast.Module | None:
    """AST of an installed function (see code_source); None when it does not exist."""
    src = code_source(modname, qualname)
    return None if src is None else parse(src)


def find_def(tree: ast.AST, *path: str) -> ast.AST | None:
    """The class/function named ``path[0]`` anywhere in ``tree``, then ``path[1]`` directly in
    its body, ...; None when absent (``find_def(tree, "XPUWorker", "shutdown")``)."""
    defs = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    node = next((n for n in ast.walk(tree) if isinstance(n, defs) and n.name == path[0]), None)
    for name in path[1:]:
        if node is None:
            return None
        node = next((n for n in node.body if isinstance(n, defs) and n.name == name), None)
    return node


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def calls(tree: ast.AST) -> Iterator[ast.Call]:
    return (n for n in ast.walk(tree) if isinstance(n, ast.Call))


def calls_to(tree: ast.AST, name: str) -> list[ast.Call]:
    """Calls of a function or method named ``name`` (``sched_yield()``, ``x.y.sched_yield()``)."""
    out = []
    for call in calls(tree):
        func = call.func
        last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if last == name:
            out.append(call)
    return out


def identifiers(tree: ast.AST) -> set[str]:
    """Every name the code uses or defines: variables, attributes, functions, classes,
    arguments, imported names (comments and string constants are not in the tree's names)."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            out.add(n.name)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.alias):
            out.update(p for p in (n.name.split(".")[-1], n.asname) if p)
        elif isinstance(n, ast.ImportFrom) and n.module:
            out.update(n.module.split("."))
    return out


def stored_attributes(tree: ast.AST) -> set[str]:
    """Attributes assigned to (``x.shutdown_timeout = 5``)."""
    return {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
    }


# -- fingerprints: is the installed code the code a patch was tested on? ------------------------


def target_node(tree: ast.Module, qualname: str) -> ast.AST | None:
    """The definition ``qualname`` ("Class.method", "function") in a module's AST; the module
    itself for ""."""
    return tree if not qualname else find_def(tree, *qualname.split("."))


def _digest(tree: ast.Module | None, qualname: str) -> str | None:
    node = None if tree is None else target_node(tree, qualname)
    return None if node is None else hashlib.sha256(ast.dump(node).encode()).hexdigest()[:16]


def _tree(src: str | None) -> ast.Module | None:
    try:
        return None if src is None else ast.parse(src)
    except (SyntaxError, ValueError):
        return None


def fingerprint_source(src: str | None, qualname: str) -> str | None:
    """sha256 (16 hex digits) of the AST of ``qualname`` in a module's source: comments, blank
    lines and formatting do not count, any change of code does. None: no such definition."""
    return _digest(_tree(src), qualname)


@functools.cache
def _installed_tree(modname: str) -> ast.Module | None:
    """An installed module's AST, parsed once per process: several targets of several patches
    live in one module (vllm.v1.engine.core), and installed code does not change under us."""
    return _tree(module_source(modname))


def fingerprint(target: str) -> str | None:
    """The fingerprint of an installed target ``"module:Qual.name"`` (None: absent)."""
    module, _, qualname = target.partition(":")
    return _digest(_installed_tree(module), qualname)
