"""The shape of installed code, read without running it: sources, ASTs, the definitions and calls
in them (never the words: comments and strings do not count), and the AST fingerprint that says
whether a target is the code a patch was tested on. Patches' check()s and the release gate use it.
"""

from __future__ import annotations

import ast
import gc
import hashlib
import importlib.util
import textwrap
from collections.abc import Iterable, Iterator


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


def source_digest(src: str | None) -> str | None:
    """A module's whole text, hashed (None: absent): the same text as a recorded release's is that
    release's code, every target in it, without parsing it."""
    return None if src is None else hashlib.sha256(src.encode()).hexdigest()[:16]


def fingerprints(targets: Iterable[str]) -> dict[str, str | None]:
    """The fingerprints of installed targets ``"module:Qual.name"`` (None: absent), each module
    parsed once, with the collector paused (in a process holding vLLM and torch, building an AST
    otherwise pays mostly for collections), and no tree kept (ASTs are large)."""
    by_module: dict[str, list[str]] = {}
    for target in targets:
        by_module.setdefault(target.partition(":")[0], []).append(target)
    out = {}
    collecting = gc.isenabled()
    gc.disable()
    try:
        for module, found in by_module.items():
            tree = _tree(module_source(module))
            out.update((t, _digest(tree, t.partition(":")[2])) for t in found)
    finally:
        if collecting:
            gc.enable()
    return out
