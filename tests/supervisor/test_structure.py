"""The code's shape, checked: no import cycle among the project's modules (function-local imports
included: they only hide a cycle), and no function in the supervisor longer than a screen."""

from __future__ import annotations

import ast
import pathlib

from tests.harness import ROOT

MAX_FUNCTION_LINES = 60
# module name -> its source: the package, and the patches it installs as vllm_intel.patches
SOURCES = {
    **{
        ".".join(p.relative_to(ROOT).with_suffix("").parts): p
        for p in (ROOT / "vllm_intel").rglob("*.py")
    },
    **{
        "vllm_intel.patches." + p.stem if p.stem != "__init__" else "vllm_intel.patches": p
        for p in (ROOT / "patches").glob("*.py")
    },
}
MODULES = {name.removesuffix(".__init__"): path for name, path in SOURCES.items()}


def imports_of(name: str, path: pathlib.Path) -> set[str]:
    """The project modules `name` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from . import x`
    return {m for m in found if m in MODULES and m != name}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle():
    graph = {name: imports_of(name, path) for name, path in MODULES.items()}
    # A package importing its own submodules (patches/__init__ -> registry) is no cycle unless
    # a submodule imports the package back: kept as edges, so that case is found too.
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_function_in_the_package_is_longer_than_a_screen():
    """The supervisor and the patch plugin alike (patches/ is installed as vllm_intel.patches)."""
    long = []
    for path in sorted([*(ROOT / "vllm_intel").rglob("*.py"), *(ROOT / "patches").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert long == [], long
