"""The code's shape, checked: no import cycle among the project's modules (function-local imports
included: they only hide a cycle), no function in the supervisor longer than a screen, and the
supervisor reaching the patch plugin through its public names only."""

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


# The core: the loop and all it imports, directly or through another (decisions/0011 counts
# their lines). What runs beside it is an extension, each named here, reaching the loop through
# extension.Extension only (docs/CONVENTIONS.md); cli makes them and passes them in.
CORE = {
    *(
        f"vllm_intel.supervisor.{m}"
        for m in ("loop", "extension", "state", "signals", "errors", "timing", "log", "paths")
    ),
    "vllm_intel.supervisor.observe",  # the loop's own thread: vLLM's /health and /metrics
    "vllm_intel.in_vllm.run_files",  # the run directory's files and their shape
    "vllm_intel.in_vllm.jsonlog",  # the JSON lines' clock
}
EXTENSIONS = {"metrics", "janitor", "relay", "hub", "reports", "leftovers"}
PACKAGES = {"vllm_intel", "vllm_intel.in_vllm", "vllm_intel.supervisor"}  # no code in them


def reached_from(module: str) -> set[str]:
    """Every project module `module` imports, directly or through another."""
    graph = {name: imports_of(name, path) for name, path in MODULES.items()}
    reached, todo = set(), [module]
    while todo:
        for nxt in graph[todo.pop()] - reached:
            reached.add(nxt)
            todo.append(nxt)
    return reached


def test_the_loop_imports_only_the_core():
    """The core (loop.py and what it imports) knows the Extension interface, not the parts that
    implement it: each of them can be left out without touching the loop."""
    loop = "vllm_intel.supervisor.loop"
    core = reached_from(loop) - PACKAGES | {loop}
    assert core == CORE, sorted(core ^ CORE)


def test_what_runs_inside_vllm_imports_nothing_of_the_supervisor():
    """vllm_intel/in_vllm/ is imported in vLLM's processes, before and beside vLLM: each of its
    modules reaches only its own folder (and the standard library)."""
    inside = {m for m in MODULES if m.startswith("vllm_intel.in_vllm.")}
    assert inside, sorted(MODULES)
    for m in inside:
        assert reached_from(m) - PACKAGES <= inside, (m, sorted(reached_from(m) - inside))


def extension_modules() -> set[str]:
    """The supervisor's modules that define a subclass of extension.Extension."""
    found = set()
    for path in (ROOT / "vllm_intel" / "supervisor").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            bases = [ast.unparse(b) for b in getattr(node, "bases", [])]
            if isinstance(node, ast.ClassDef) and {"Extension", "extension.Extension"} & {*bases}:
                found.add(path.stem)
    return found


def test_every_extension_is_listed_and_outside_the_core():
    assert extension_modules() == EXTENSIONS
    assert not {f"vllm_intel.supervisor.{m}" for m in EXTENSIONS} & CORE


PLUGIN = "vllm_intel.patches"


def plugin_uses(path: pathlib.Path) -> list[str]:
    """What a module takes from the patch plugin: ``vllm_intel.patches.<name>`` for each import
    of or from it, each attribute of a name bound to the package, and each string naming one."""
    tree = ast.parse(path.read_text())
    aliases, used = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == PLUGIN or a.name.startswith(PLUGIN + "."):
                    used.append(a.name)
                    aliases.add(a.asname or "")  # `import vllm_intel.patches` binds vllm_intel
        elif isinstance(node, ast.ImportFrom):
            # relative to vllm_intel.supervisor: `from .. import patches` is vllm_intel's
            base = ".".join(["vllm_intel", "supervisor"][: 3 - node.level] if node.level else [])
            module = ".".join(filter(None, [base, node.module]))
            if module == "vllm_intel":
                aliases.update(a.asname or a.name for a in node.names if a.name == "patches")
            elif module == PLUGIN or module.startswith(PLUGIN + "."):
                used += [f"{module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            used += [w for w in node.value.split() if w.startswith(PLUGIN + ".")]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) in aliases - {""}:
            used.append(f"{PLUGIN}.{node.attr}")
    return used


def private_uses(path: pathlib.Path) -> list[str]:
    import vllm_intel.patches as plugin

    public = {PLUGIN, *(f"{PLUGIN}.{name}" for name in plugin.__all__)}
    return [f"{path.name}: {name}" for name in plugin_uses(path) if name not in public]


def test_the_supervisor_uses_only_the_plugins_public_names():
    """vllm_intel.patches' __all__ is what the supervisor may use: not its modules (registry, a
    patch's module, _base), which change with the patches."""
    paths = sorted((ROOT / "vllm_intel" / "supervisor").glob("*.py"))
    assert [u for p in paths for u in private_uses(p)] == []
    assert any(plugin_uses(p) for p in paths)  # the check reads what the supervisor imports


def test_a_private_use_of_the_plugin_is_found(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from vllm_intel.patches import registry, patch_names\n"
        "from vllm_intel.patches._base import vllm_version\n"
        "import vllm_intel.patches.shm_busy_sleep\n"
        "from vllm_intel import patches as plugin\n"
        "plugin.main([]); plugin.registry.all_patches()\n"
        "importlib.import_module('vllm_intel.patches.fast_exit')\n"
        "from ..patches import declarations, _base\n"
        "from .. import patches as mine\n"
        "mine.apply_all(); mine.tested_code\n"
    )
    assert sorted(private_uses(module)) == [
        "m.py: vllm_intel.patches._base",
        "m.py: vllm_intel.patches._base.vllm_version",
        "m.py: vllm_intel.patches.fast_exit",
        "m.py: vllm_intel.patches.registry",
        "m.py: vllm_intel.patches.registry",
        "m.py: vllm_intel.patches.shm_busy_sleep",
        "m.py: vllm_intel.patches.tested_code",
    ]
