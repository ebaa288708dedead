"""The shutdown timeline (vllm_intel/supervisor/timing.py): the drain walks from the command line to
vLLM, the drain-deadline patch, the deadline and the grace period through that module alone, each
step defined there once, and the module stays light enough to import inside vLLM's processes."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

from tests.harness import ROOT
from vllm_intel.supervisor import cli, settings, timing
from vllm_intel.supervisor.vllm_args import resolve

# Who uses which step of the timeline, by its name in timing.py.
USERS = {
    "patches/drain_deadline.py": {"abort_at", "admit_wait"},
    "patches/xpu_shutdown.py": {"XPU_MIN_DRAIN_S"},
    "vllm_intel/supervisor/settings.py": {"DEFAULT_DRAIN_S", "XPU_MIN_DRAIN_S"},
    "vllm_intel/supervisor/loop.py": {"deadline", "exit_by", "KILL_GRACE_S"},
    "vllm_intel/supervisor/cli.py": {"grace_period"},
}
TIMELINE_WORDS = ("DRAIN", "SHUTDOWN", "ABORT", "ADMIT", "LEAD", "GRACE", "DEADLINE", "TEARDOWN")


def test_timing_imports_nothing_heavy():
    """The patches import it in vLLM's API server and engine: no torch, psutil or vLLM."""
    code = "import sys, vllm_intel.supervisor.timing; print(' '.join(sorted(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    ours = {m for m in loaded if m.split(".")[0] == "vllm_intel"}
    assert ours == {
        "vllm_intel",
        "vllm_intel.supervisor",
        "vllm_intel.supervisor.errors",
        "vllm_intel.supervisor.timing",
    }
    assert not {m.split(".")[0] for m in loaded} & {"torch", "psutil", "vllm", "numpy"}


@pytest.mark.parametrize(
    "args,env,drain",
    [
        ([], {"INTEL_VLLM_DRAIN_TIMEOUT": "7"}, 7),
        (["--shutdown-timeout", "12"], {"INTEL_VLLM_DRAIN_TIMEOUT": "7"}, 12),
        ([], {}, timing.DEFAULT_DRAIN_S),
        (["--shutdown-timeout=0"], {"INTEL_VLLM_DEVICE": "xpu"}, timing.XPU_MIN_DRAIN_S),
    ],
    ids=["env", "flag", "default", "xpu-floor"],
)
def test_a_drain_walks_from_the_command_line_to_vllm_through_the_timeline(
    tmp_path, monkeypatch, capsys, args, env, drain
):
    """A drain given as INTEL_VLLM_DRAIN_TIMEOUT or --shutdown-timeout is the --shutdown-timeout
    vLLM reads from the argv the supervisor builds; inside vLLM drain-deadline admits, then
    aborts, at timing's times; the group's deadline and the grace period `grace-period` prints
    are timing's too, in that order, the engine's window ending before the group's SIGTERM."""
    cfg = settings.serve_config([str(tmp_path), *args], env=env)
    assert cfg.drain == drain
    assert resolve(list(cfg.argv[cfg.argv.index("serve") + 1 :])).shutdown_timeout == drain
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli.grace_period([str(tmp_path), *args]) == 0
    assert int(capsys.readouterr().out) == timing.grace_period(drain)

    engine_ends = timing.admit_wait(drain) + drain  # after SIGTERM, at the latest
    assert 0 < timing.abort_at(drain) < drain
    assert engine_ends <= timing.deadline(drain) - timing.KILL_GRACE_S
    assert timing.deadline(drain) < timing.exit_by(drain) < timing.grace_period(drain)
    for path, names in USERS.items():  # each computes them with timing's own definitions
        assert names <= names_used(ROOT / path), path


def names_used(path: pathlib.Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.alias):
            found.add(node.asname or node.name)
    return found


def own_timeline(tree: ast.AST) -> list[str]:
    """What a module computes of the timeline itself: a ``min(x, y / 4)`` (the abort lead, the
    admission wait), a number given to a timeline name or to ``.shutdown_timeout`` (0 there is
    vLLM's abort mode, no step of the timeline)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "min":
            quarters = [
                a
                for a in node.args
                if isinstance(a, ast.BinOp)
                and isinstance(a.op, ast.Div)
                and getattr(a.right, "value", None) == 4
            ]
            found += [f"{node.lineno}: min(..., /4)" for _ in quarters]
        elif (
            isinstance(node, ast.Assign | ast.AnnAssign)
            and isinstance(node.value, ast.Constant)
            and type(node.value.value) in (int, float)
            and node.value.value != 0
        ):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                name = getattr(target, "id", None) or getattr(target, "attr", "")
                if name == "shutdown_timeout" or any(w in name.upper() for w in TIMELINE_WORDS):
                    found.append(f"{node.lineno}: {name} = {node.value.value}")
    return sorted(found, key=lambda f: int(f.split(":")[0]))


def test_no_other_module_computes_the_timeline():
    sources = [*(ROOT / "vllm_intel").rglob("*.py"), *(ROOT / "patches").glob("*.py")]
    own = {
        str(p.relative_to(ROOT)): found
        for p in sources
        if p.name != "timing.py" and (found := own_timeline(ast.parse(p.read_text())))
    }
    assert own == {}
    assert own_timeline(ast.parse((ROOT / "vllm_intel/supervisor/timing.py").read_text()))


def test_the_checker_finds_a_timeline_of_its_own():
    code = (
        "ABORT_LEAD_S = 2.0\nXPU_MIN_SHUTDOWN_TIMEOUT = 5\nTICK = 0.5\n"
        "def f(cfg, t):\n    cfg.shutdown_timeout = 5\n    return t - min(2, t / 4)\ncfg.shutdown_timeout = 0\n"
    )
    assert own_timeline(ast.parse(code)) == [
        "1: ABORT_LEAD_S = 2.0",
        "2: XPU_MIN_SHUTDOWN_TIMEOUT = 5",
        "5: shutdown_timeout = 5",
        "6: min(..., /4)",
    ]
