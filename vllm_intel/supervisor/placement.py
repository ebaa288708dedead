"""Where vLLM runs: the CPUs a pin takes (INTEL_VLLM_CPU_PLAN=pin, opt-in) and the follower that
moves the pin off CPUs others load.

The pin follows free CPUs: under a CPU quota the plan (INTEL_VLLM_CPU_PLAN=pin, opt-in)
confines every vLLM process to ceil(quota) CPUs, the idlest at start (choose_pin). Later
others may load those CPUs: two replicas started together saw the same idle CPUs and pinned to
them, or a neighbour pinned its own work there. The kernel moves unpinned work away from a busy
CPU, never pinned work, so a pin chosen once would stay on a shared CPU for good.

So a thread of the supervisor looks every CHECK_S (jittered: replicas must not look, and move, in
step): the load others put on the pinned CPUs (the CPUs' busy time from /proc/stat minus what
vLLM's processes used) against the least loaded other allowed CPUs. When ours carry more by over
MARGIN_CPU, in LOOKS looks in a row naming the same CPUs, every thread of every vLLM process moves
there (one log line). Threads started later inherit the new set from the thread that starts them.
The thread wakes every WAKE_S while it waits; a look in which a wake-up came over LATE_S late is
dropped: the container was frozen (`docker pause`, a cgroup freeze, SIGSTOP), and what others ran
meanwhile says nothing about the CPUs while vLLM runs. (The look's length alone does not show it:
a freeze that ends before the look does leaves it on time.)
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import random
import threading
import time

import psutil

from .limits import format_cpu_list, read_text
from .log import log
from .plan import Plan

CHECK_S = 10.0
MARGIN_CPU = 0.25  # CPUs of other work: less is the noise of a host's services and of us
LOOKS = 2  # in a row: a burst on our CPU is not a reason to move
WAKE_S = 1.0
LATE_S = 1.0  # a wake-up this late: frozen (a CFS quota stops a thread for under 0.1 s)
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


PROC_STAT = pathlib.Path("/proc/stat")


def cpu_ticks(cpus, stat: pathlib.Path = PROC_STAT) -> dict[int, tuple[int, int]]:
    """(idle + iowait, total) ticks so far of each CPU in `cpus` (/proc/stat, the host's CPUs).
    Not psutil.cpu_times(percpu=True): its list has no CPU numbers, and with a CPU offline its
    positions are not the numbers that affinity masks use."""
    out = {}
    for line in (read_text(stat) or "").splitlines():
        name, *fields = line.split() or [""]
        if name[3:].isdigit() and name.startswith("cpu") and int(name[3:]) in cpus:
            # user nice system idle iowait irq softirq steal (guest time is inside user)
            ticks = [int(f) for f in fields[:8]]
            out[int(name[3:])] = (ticks[3] + ticks[4], sum(ticks))
    return out


def cpu_idle(cpus, sample_s: float = 0.2, stat: pathlib.Path = PROC_STAT) -> dict[int, int]:
    """Idle + iowait ticks of each CPU in `cpus` over `sample_s`."""
    before = cpu_ticks(cpus, stat)
    time.sleep(sample_s)
    after = cpu_ticks(cpus, stat)
    return {cpu: after[cpu][0] - before.get(cpu, (0, 0))[0] for cpu in after}


def one_per_core(ranked, n: int, core_of: dict | None = None) -> list[int]:
    """The first n of `ranked` (best first), taking one CPU of each physical core before any SMT
    sibling: two siblings share one core's execution units."""
    core_of = core_of or {}
    firsts, siblings, seen = [], [], set()
    for cpu in ranked:
        core = core_of.get(cpu, cpu)
        (siblings if core in seen else firsts).append(cpu)
        seen.add(core)
    return sorted((firsts + siblings)[:n])


def least_busy(cpus, n: int, idle: dict[int, int], core_of: dict | None = None) -> list[int]:
    """The n CPUs of `cpus` idle longest, one per core first; on a tie the higher numbers (vLLM's
    `auto` binding and many host services start at CPU 0)."""
    ranked = sorted(cpus, key=lambda c: (idle.get(c, 0), c), reverse=True)
    return one_per_core(ranked, n, core_of)


def choose_pin(plan: Plan, idle=cpu_idle) -> Plan:
    """The plan with the CPUs of its pin chosen: the idlest allowed ones now, one per physical
    core first. `idle(cpus)`: each CPU's idle ticks, asked only when the plan pins."""
    if not plan.pin_count:
        return plan
    allowed = plan.limits.cpus
    cpus = least_busy(allowed, plan.pin_count, idle(allowed), plan.limits.core_of)
    return dataclasses.replace(plan, pin=tuple(cpus))


def choose(
    pinned: list[int], allowed: list[int], others: dict[int, float], core_of: dict | None = None
) -> list[int] | None:
    """The CPUs to move to, or None to stay. `others`: each allowed CPU's load from processes that
    are not vLLM's, in CPUs (0..1). One CPU per physical core first (as the plan chose); ties
    keep the CPUs we are on, then the higher numbers."""
    n = len(pinned)
    ranked = sorted(allowed, key=lambda c: (others.get(c, 0.0), c not in pinned, -c))
    best = one_per_core(ranked, n, core_of)
    here = sum(others.get(c, 0.0) for c in pinned) / n
    there = sum(others.get(c, 0.0) for c in best) / n
    return best if best != sorted(pinned) and here - there > MARGIN_CPU else None


def pids_cpu_s(pids) -> float:
    """CPU seconds (user + system) used so far by these processes, each with the children it has
    reaped (vLLM runs short-lived helpers: their CPU must not vanish when they exit, or it would
    count as others' load). Gone processes count nothing."""
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def tree_pids(root: int | psutil.Process) -> list[int]:
    """`root` and its descendants; none when `root` (a handle: the process it was created for)
    is gone or its pid now names another process."""
    try:
        proc = root if isinstance(root, psutil.Process) else psutil.Process(root)
        pids = [proc.pid] + [p.pid for p in proc.children(recursive=True)]
        return pids if proc.is_running() else []
    except psutil.Error:
        return []


def tree_cpu_s(root: int | psutil.Process) -> float:
    """pids_cpu_s of `root` and its descendants."""
    try:
        return pids_cpu_s(tree_pids(root))
    except psutil.Error:
        return 0.0


def move(root: int | psutil.Process, cpus: list[int]) -> int:
    """Every thread of `root` and its descendants confined to `cpus`; how many were moved."""
    moved = 0
    try:
        pids = tree_pids(root)
    except psutil.Error:
        return moved
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
                moved += 1
            except OSError:  # gone meanwhile
                pass
    return moved


class Follower:
    """The thread that keeps vLLM's pin on CPUs free of other work (see the module doc)."""

    def __init__(
        self,
        root: int | psutil.Process,
        pinned: list[int],
        allowed: list[int],
        core_of: dict | None = None,
        check_s: float = CHECK_S,
    ):
        # A handle made now, while the child is ours and unreaped (its pid cannot be reused
        # yet): is_running() compares its create time, so once vLLM is reaped and the pid names
        # another process, nothing of that process is ever moved.
        self.proc: psutil.Process | None
        if isinstance(root, psutil.Process):
            self.proc = root
        else:
            try:
                self.proc = psutil.Process(root)
            except psutil.Error:
                self.proc = None  # gone already: the thread ends at once
        self.root = root if isinstance(root, int) else root.pid
        self.pinned, self.allowed = sorted(pinned), sorted(allowed)
        self.core_of = core_of or {}
        self.check_s = check_s
        self._looks, self._target = 0, None  # looks in a row that found the same better CPUs
        self._last, self.seen = None, {}  # the previous sample; the load the last look saw
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pin-follower", daemon=True)

    def start(self) -> Follower:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def alive(self) -> bool:
        """vLLM's API server is still the process this follower started for: neither reaped
        (nor a zombie awaiting it) nor its pid reused."""
        if self.proc is None:
            return False
        try:
            return self.proc.is_running() and self.proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def move(self, cpus: list[int]) -> int:
        """`move` of vLLM's tree, checked first: 0 when it is gone."""
        return move(self.proc, cpus) if self.alive() else 0

    def sample(self) -> tuple[dict[int, tuple[int, int]], float]:
        return cpu_ticks(set(self.allowed)), (tree_cpu_s(self.proc) if self.proc else 0.0)

    def others(self, before, after) -> dict[int, float]:
        """Each allowed CPU's load from other processes between two samples, in CPUs."""
        (t0, ours0), (t1, ours1) = before, after
        load = {}
        for cpu in self.allowed:
            if cpu not in t0 or cpu not in t1:
                continue
            total = t1[cpu][1] - t0[cpu][1]
            busy = total - (t1[cpu][0] - t0[cpu][0])
            load[cpu] = busy / total if total > 0 else 0.0
        if not load:
            return load
        # vLLM ran only on the pinned CPUs: its share comes off them, evenly
        span = sum(t1[c][1] - t0[c][1] for c in load) / len(load) / TICKS_PER_S
        ours = max(ours1 - ours0, 0.0) / span / len(self.pinned) if span > 0 else 0.0
        for cpu in self.pinned:
            if cpu in load:
                load[cpu] = max(load[cpu] - ours, 0.0)
        return load

    def look(self, now, late_s: float) -> list[int] | None:
        """One look: the CPUs to move to now (LOOKS looks in a row found them), else None.
        `late_s`: the latest wake-up since the last look (over LATE_S: we were frozen)."""
        last, self._last = self._last, now
        if late_s > LATE_S:
            self._looks, self._target = 0, None
            return None
        self.seen = self.others(last, now)
        found = choose(self.pinned, self.allowed, self.seen, self.core_of)
        same = found is not None and found == self._target
        self._looks, self._target = (self._looks + 1 if same else int(found is not None)), found
        return found if self._looks >= LOOKS else None

    def wait(self, seconds: float) -> float | None:
        """Sleep `seconds`, waking every WAKE_S: how late the latest wake-up was (s), or None when
        stopped."""
        end, late = time.monotonic() + seconds, 0.0
        while (left := end - time.monotonic()) > 0:
            step, t = min(WAKE_S, left), time.monotonic()
            if self._stop.wait(step) or not self.alive():  # stopped, or vLLM was reaped
                return None
            late = max(late, time.monotonic() - t - step)
        return late

    def _run(self) -> None:
        if not self.alive():
            return
        self._last = self.sample()
        moved = False
        while (late := self.wait(self.check_s * random.uniform(0.75, 1.25))) is not None:
            if moved:  # a thread started while the last move listed them kept the old CPUs
                if self.move(self.pinned) == 0:
                    return  # vLLM is gone
                moved = False
            target = self.look(self.sample(), late)
            if target is None:
                continue
            threads = self.move(target)
            if threads == 0:
                return  # vLLM is gone
            seen = self.seen
            log(
                f"pin: CPU {format_cpu_list(self.pinned)} carried "
                f"{max(seen[c] for c in self.pinned if c in seen):.2f} CPU of other work, "
                f"CPU {format_cpu_list(target)} "
                f"{max(seen.get(c, 0.0) for c in target):.2f}: moved vLLM's {threads} threads there"
            )
            self.pinned, self._looks, self._target, moved = target, 0, None, True
            self._last = self.sample()  # the next look measures the new place only
