"""The pin follows free CPUs (supervisor/placement.py): the choice, the load others put on each CPU
from two samples, and real processes: a vLLM-like tree pinned to a CPU that a foreign busy loop
also uses moves, every thread of it, to the free CPU. (That it stays where others' load is
within the margin, or no better elsewhere, is test_choose: on a real host that depends on the
host's other tenants.)"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tests.harness import ROOT
from vllm_intel.supervisor import placement
from vllm_intel.supervisor.placement import choose


@pytest.mark.parametrize(
    "pinned,allowed,others,want",
    [
        ([0], [0, 1], {0: 0.9, 1: 0.1}, [1]),  # a neighbour on our CPU, the other free
        ([0], [0, 1], {0: 0.3, 1: 0.1}, None),  # within the margin: stay
        ([0], [0, 1], {0: 0.9, 1: 0.8}, None),  # everything busy: nowhere better
        ([1], [0, 1], {0: 0.0, 1: 0.0}, None),  # a tie keeps our CPU
        ([0, 1], [0, 1, 2, 3], {0: 1.0, 1: 0.0, 2: 0.0, 3: 0.1}, [1, 2]),  # keep 1, leave 0
        ([2, 3], [0, 1, 2, 3], {0: 0.0, 1: 0.0, 2: 0.2, 3: 0.2}, None),  # 0.2 < margin
        ([5], [4, 5, 6], {4: 0.0, 5: 1.0, 6: 0.0}, [6]),  # a tie elsewhere: the higher number
    ],
)
def test_choose(pinned, allowed, others, want):
    assert choose(pinned, allowed, others) == want


def test_choose_takes_one_cpu_per_core_first():
    cores = {0: "a", 1: "a", 2: "b", 3: "b"}
    # 0 and 1 are free but siblings: one of them and the other core's freer CPU
    assert choose([2, 3], [0, 1, 2, 3], {0: 0.0, 1: 0.0, 2: 0.9, 3: 0.5}, cores) == [1, 3]


def test_others_take_vllms_own_use_off_the_pinned_cpus():
    f = placement.Follower(1, [0], [0, 1])
    hz = placement.TICKS_PER_S
    # 1 s: CPU 0 fully busy, of which vLLM used 0.6 s; CPU 1 a quarter busy
    before = ({0: (0, 0), 1: (0, 0)}, 10.0)
    after = ({0: (0, hz), 1: (hz * 3 // 4, hz)}, 10.6)
    got = f.others(before, after)
    assert got[0] == pytest.approx(0.4, abs=0.02) and got[1] == pytest.approx(0.25, abs=0.02)
    assert f.others(before, ({0: (0, hz), 1: (0, hz)}, 12.0))[0] == 0.0  # never below 0


TREE = """
import os, subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # a second thread
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def affinities(pid: int) -> set[frozenset[int]]:
    import psutil

    out = set()
    for p in [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True):
        for tid in os.listdir(f"/proc/{p.pid}/task"):
            out.add(frozenset(os.sched_getaffinity(int(tid))))
    return out


@pytest.fixture
def two_cpus():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs to move between")
    return cpus[:2]


@pytest.fixture
def procs():
    """Processes to SIGKILL at the end (Popen objects, or pids of their children)."""
    started: list[subprocess.Popen | int] = []
    yield started
    for p in started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p if isinstance(p, int) else p.pid, signal.SIGKILL)
        if not isinstance(p, int):
            p.wait()


def start_tree(procs, cpu: int) -> subprocess.Popen:
    tree = subprocess.Popen(
        [sys.executable, "-c", TREE],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, [cpu]),
    )
    procs.append(tree)
    procs.append(int(tree.stdout.readline()))  # its child
    return tree


def test_a_tree_on_a_busy_cpu_moves_to_the_free_one(two_cpus, procs, capfd):
    busy, free = two_cpus
    tree = start_tree(procs, busy)
    assert affinities(tree.pid) == {frozenset([busy])}
    loop = subprocess.Popen(  # someone else's work pinned to the same CPU
        [sys.executable, "-c", "while True: pass"],
        preexec_fn=lambda: os.sched_setaffinity(0, [busy]),
    )
    procs.append(loop)
    follower = placement.Follower(tree.pid, [busy], two_cpus, check_s=0.3).start()
    try:
        end = time.monotonic() + 8
        while time.monotonic() < end and affinities(tree.pid) == {frozenset([busy])}:
            time.sleep(0.1)
    finally:
        follower.stop()
    err = capfd.readouterr().err
    assert affinities(tree.pid) == {frozenset([free])}, err  # every thread of every process
    assert os.sched_getaffinity(loop.pid) == {busy}  # the neighbour is not ours to move
    assert f"pin: CPU {busy} carried" in err and f"CPU {free} " in err, err


def loaded(seconds: float, ours_busy: float, other_busy: float) -> tuple:
    """A sample `seconds` after the zero sample: CPU 0 (ours) and CPU 1 busy by these shares."""
    hz = placement.TICKS_PER_S
    total = int(seconds * hz)
    return (
        {0: (int(total * (1 - ours_busy)), total), 1: (int(total * (1 - other_busy)), total)},
        0.0,
    )


@pytest.mark.parametrize("late_s,moves", [(0.05, True), (5.0, False)])
def test_looks_across_a_freeze_are_dropped(late_s, moves):
    """Someone else's work on our CPU in two looks in a row moves us; the same load seen in looks
    during which a wake-up came 5 s late (docker pause froze the supervisor with vLLM) does not."""
    f = placement.Follower(1, [0], [0, 1], check_s=10.0)
    f._last = ({0: (0, 0), 1: (0, 0)}, 0.0)
    got = [f.look(loaded(10.0 * k, 0.95, 0.05), late_s) for k in (1, 2, 3)]
    assert got == ([None, [1], [1]] if moves else [None, None, None])
    assert f.seen.get(0, 0.0) == (pytest.approx(0.95, abs=0.02) if moves else 0.0)


WAITER = """
from vllm_intel.supervisor import placement
print("waiting", flush=True)
print(placement.Follower(1, [0], [0, 1]).wait(float(__import__("sys").argv[1])), flush=True)
"""


@pytest.mark.parametrize("stopped_s", [0.0, 2.5])
def test_the_wait_sees_a_freeze_that_ends_before_it_does(stopped_s):
    """A real process stopped (SIGSTOP) for 2.5 s in the middle of a 5 s wait: the wait ends on
    time, and says a wake-up came that late; left alone, its wake-ups are on time."""
    child = subprocess.Popen(
        [sys.executable, "-c", WAITER, "5"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # this checkout's package
    )
    try:
        assert child.stdout.readline() == "waiting\n"
        time.sleep(0.7)
        if stopped_s:
            child.send_signal(signal.SIGSTOP)
            time.sleep(stopped_s)
            child.send_signal(signal.SIGCONT)
        late = float(child.stdout.readline())
    finally:
        child.kill()
        child.wait()
    if stopped_s:
        assert (
            stopped_s - placement.WAKE_S - 0.3 < late < stopped_s + 0.5 and late > placement.LATE_S
        )
    else:
        assert late < 0.5


class Recycled(psutil.Process):
    """A handle whose process is gone and whose pid now names another (is_running() compares
    the create time: here it never matches)."""

    def is_running(self):
        return False


@pytest.fixture
def wants_to_move(monkeypatch):
    """Every look wants a move; every move and affinity change recorded, none made."""
    calls = []
    monkeypatch.setattr(placement, "choose", lambda pinned, allowed, *a: [allowed[-1]])
    monkeypatch.setattr(placement, "LOOKS", 1)
    monkeypatch.setattr(placement, "WAKE_S", 0.05)
    monkeypatch.setattr(placement.os, "sched_setaffinity", lambda *a: calls.append(("affinity", a)))
    errors = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    return calls, errors


def sleeper(procs: list) -> subprocess.Popen:
    """A child that sleeps a minute (ended by the `procs` fixture)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    procs.append(child)
    return child


def test_a_recycled_pid_is_never_moved(procs, wants_to_move):
    """vLLM reaped, its pid reused by another process: the follower's handle (made while vLLM
    was its child) no longer matches, and the follower ends without touching that process."""
    calls, errors = wants_to_move
    other = sleeper(procs)
    handle = Recycled(other.pid)
    assert placement.move(handle, [0]) == 0
    follower = placement.Follower(handle, [0], [0, 1], check_s=0.05).start()
    follower._thread.join(3)
    assert not follower._thread.is_alive()
    assert calls == [] and errors == []


def test_the_follower_stops_when_vllm_is_reaped(procs, wants_to_move, monkeypatch):
    calls, errors = wants_to_move
    moves = []
    monkeypatch.setattr(placement, "move", lambda root, cpus: moves.append(root) or 1)
    child = sleeper(procs)
    follower = placement.Follower(child.pid, [0], [0, 1], check_s=30.0).start()
    time.sleep(0.2)
    assert follower._thread.is_alive()
    child.kill()
    child.wait()  # reaped: its pid may be anyone's from now on
    follower._thread.join(3)  # well before the 30 s look
    assert not follower._thread.is_alive()
    assert moves == [] and calls == [] and errors == []


def test_a_live_vllm_is_moved_through_its_handle(procs, wants_to_move, monkeypatch):
    calls, errors = wants_to_move
    moves = []
    monkeypatch.setattr(placement, "move", lambda root, cpus: moves.append(root) or 1)
    child = sleeper(procs)
    follower = placement.Follower(child.pid, [0], [0, 1], check_s=0.05).start()
    try:
        end = time.monotonic() + 5
        while not moves and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        follower.stop()
    assert moves and all(isinstance(m, psutil.Process) and m.pid == child.pid for m in moves)
    assert errors == []
