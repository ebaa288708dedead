"""A simulated host for the opt-in pin (INTEL_VLLM_CPU_PLAN=pin): pods with CPU quotas pinned by
the real placement code (least_busy at start, the Follower's look() and choose() while they run)
on a host of SMT cores with unpinned neighbours' load spread by a "kernel" onto the least loaded
CPUs. Only the CPU accounting is simulated: /proc/stat ticks and each pod's CPU time are computed
from the loads, second by second, and handed to the real code as its samples.

Limits of the model: a pinned pod's demand is its quota, spread evenly over its pinned CPUs;
CPUs shared by pods split their capacity in proportion to demand; NUMA is not modelled (the pin
ignores it); neighbours' load moves instantly to the least loaded CPUs.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random

from vllm_intel.supervisor import placement

TICKS = placement.TICKS_PER_S


@dataclasses.dataclass
class Pod:
    quota: float
    start_s: float
    follower: placement.Follower | None = None
    cpu_s: float = 0.0  # CPU time its processes used so far
    next_look: float = 0.0
    moves: int = 0
    history: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
    returned: int = 0  # moves back onto a set of CPUs it had left (oscillation)

    @property
    def pinned(self) -> list[int]:
        return self.follower.pinned if self.follower else []


@dataclasses.dataclass
class Result:
    cpus: int
    pods: int
    start: str
    neighbours: float
    shared_cpus: int  # CPUs in two pinned pods' sets at the end
    last_move_s: float | None  # when the last move happened (None: none)
    moves_per_pod_hour: float
    returns: int  # moves back to a set left before, all pods
    throttled_share: float  # of the pods' demand not served in the last 10 min (sharing)


class Host:
    def __init__(self, cpus: int, smt: int, neighbours: float, seed: int):
        self.cpus = list(range(cpus))
        self.core_of = {c: c % (cpus // smt) for c in self.cpus}  # siblings: c and c + cores
        self.neighbours = neighbours * cpus  # unpinned load, in CPUs
        self.ticks = {c: [0, 0] for c in self.cpus}  # idle, total
        self.rng = random.Random(seed)

    def sample(self, pod: Pod):
        return {c: tuple(v) for c, v in self.ticks.items()}, pod.cpu_s

    def step(self, pods: list[Pod]) -> tuple[float, float]:
        """One second: (demand, served) of the pinned pods."""
        demand = {c: 0.0 for c in self.cpus}
        for p in pods:
            for c in p.pinned:
                demand[c] += p.quota / len(p.pinned)
        served_frac = {c: min(1.0, 1.0 / d) if d > 1 else 1.0 for c, d in demand.items()}
        load = {c: min(d, 1.0) for c, d in demand.items()}
        left = self.neighbours * self.rng.uniform(0.8, 1.2)
        while left > 1e-6:  # water-filling onto the least loaded CPUs
            free = sorted((c for c in self.cpus if load[c] < 1.0), key=lambda c: load[c])
            if not free:
                break
            share = left / len(free)
            for c in free:
                take = min(share, 1.0 - load[c])
                load[c] += take
                left -= take
        total_demand = total_served = 0.0
        for p in pods:
            served = sum(p.quota / len(p.pinned) * served_frac[c] for c in p.pinned)
            p.cpu_s += served
            total_demand += p.quota
            total_served += served
        for c in self.cpus:
            self.ticks[c][0] += round((1 - load[c]) * TICKS)
            self.ticks[c][1] += TICKS
        return total_demand, total_served


def simulate(cpus: int, pods: int, quota: float, start: str, neighbours: float,
             hours: float = 1.0, smt: int = 2, seed: int = 0) -> Result:  # fmt: skip
    """`start`: "together" (all at 0 s, seeing the same idle CPUs) or "staggered" (one every 30 s)."""
    host = Host(cpus, smt, neighbours, seed)
    rng = random.Random(seed + 1)
    fleet = [Pod(quota, 0.0 if start == "together" else 30.0 * i) for i in range(pods)]
    running: list[Pod] = []
    last_move, demand_late, served_late = None, 0.0, 0.0
    end = hours * 3600
    for t in range(int(end)):
        for p in fleet:
            if p.follower is None and t >= p.start_s:
                # the plan's choice: idle over the last second of ticks, as cpu_idle samples it
                before = {c: v[0] for c, v in host.ticks.items()}
                host.step(running)
                idle = {c: host.ticks[c][0] - before[c] for c in host.cpus}
                n = math.ceil(quota)
                pin = placement.least_busy(host.cpus, n, idle, host.core_of)
                p.follower = placement.Follower(os.getpid(), pin, host.cpus, host.core_of)
                p.follower._last = host.sample(p)
                p.history.append(tuple(pin))
                p.next_look = t + placement.CHECK_S * rng.uniform(0.75, 1.25)
        started = [p for p in fleet if p.follower is not None]
        for p in started:
            if p not in running:
                running.append(p)
        demand, served = host.step(running)
        if t >= end - 600:
            demand_late, served_late = demand_late + demand, served_late + served
        for p in running:
            if t < p.next_look:
                continue
            p.next_look = t + placement.CHECK_S * rng.uniform(0.75, 1.25)
            target = p.follower.look(host.sample(p), 0.0)
            if target is None:
                continue
            f = p.follower
            f.pinned, f._looks, f._target = target, 0, None
            f._last = host.sample(p)
            p.moves += 1
            p.returned += tuple(target) in p.history
            p.history.append(tuple(target))
            last_move = t
    owners: dict[int, int] = {}
    for p in fleet:
        for c in p.pinned:
            owners[c] = owners.get(c, 0) + 1
    return Result(
        cpus, pods, start, neighbours,
        shared_cpus=sum(1 for n in owners.values() if n > 1),
        last_move_s=last_move,
        moves_per_pod_hour=sum(p.moves for p in fleet) / pods / hours,
        returns=sum(p.returned for p in fleet),
        throttled_share=1 - served_late / demand_late if demand_late else 0.0,
    )  # fmt: skip
