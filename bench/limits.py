"""limits: the CPU image under a CPU quota vs the same CPU count as a cpuset, with and without the
CPU plan (Docker only).

Containers of the image (`serve --enforce-eager`, `--shm-size 1g --memory 4g`), one per arm,
started one after the other and then all running at once; by default these three (`--limits-arms`
picks some, e.g. the goal's pair for more rounds in the same time, or `cpuset,cpuset1`: two alike
arms on CPUs 0 and 1, the noise floor of a pair on this host):
- quota+plan:  `--cpus 1 -e INTEL_VLLM_CPU_PLAN=1` (a quota smaller than the 2-CPU affinity set),
  the plan as shipped: its processes run on both CPUs;
- quota-plan:  `--cpus 1 -e INTEL_VLLM_CPU_PLAN=0` (vLLM's own thread choice; KV cache 1 GiB);
- cpuset:      `--cpuset-cpus 0` (one CPU as a cpuset; the plan has nothing to change).
`cpuset-quota` (the cpuset with `--cpus 1` on top) separates what the quota alone costs.
`--limits-starts N` starts the arms N times (fresh containers, rotated start order) and splits the
rounds between the starts: whatever makes one container serve unlike the next then varies within
the run. The load alternates between them round by round (rotating the order), so the machine's
drift hits all alike, and while one arm is measured the others are paused (an idle server still
polls, on this 2-CPU machine beside the measured arm: a one-CPU cpuset arm used 0.7-0.8 of its CPU
next to two idle servers, all of it with them paused). Per round and arm: one 2048-token stream,
then 8 concurrent 1024-token streams, one `curl` process each (common.curl_batch), 4-6 s each (a
measurement of about 1 s spreads too widely from round to round to resolve a goal); tokens/s (client side), the container's CPU time per generated token and per
second of the round (cgroup v2 `cpu.stat` usage_usec or v1 `cpuacct.usage`, read on the host: every
process in the container), and the share of CFS periods in which the quota ran out. Ratios per
round: quota+plan / cpuset (goal >= 0.95) and quota+plan / quota-plan (goal >= 1: the plan is never
slower than vLLM's defaults).
`--limits-shape SHAPE` serves a real shape of tools/build_model.py instead of the built-in tiny
model (mounted read-only, `--max-model-len 4096`): every arm's memory limit is the plan's edge for
a 1 GiB KV cache on that model (plan.least_memory), and the rounds are REAL_LOADS, whose token
counts make a round last about as long at a real model's speed on one CPU as LOADS do on the toy.
Also per arm: time to ready, peak memory (cgroup) with the memory in use at the end split into
anonymous memory and page cache (the cache of files the containers share is billed to the first
that reads them), the CPU an idle server burns, and the threads of every process in it: where a
quota goes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import pathlib
import re
import shutil
import statistics
import tempfile
import time

from tests.harness import Container
from vllm_intel.supervisor import plan, workload

from . import real
from .common import RESULTS, Row, curl_batch, log, pair_ratios, record
from .dockerutil import IMAGE, docker, engine

# Every arm gets the same memory limit: the plan sizes the KV cache from it (4 GiB -> 1 GiB).
# The plan-off arm is vLLM's thread choice with the same 1 GiB KV cache: with nothing set, vLLM
# reserves 92 % of the node's memory (--gpu-memory-utilization) and cannot start next to another
# server ("Available memory on node 0 ... is less than desired").
COMMON = ["--shm-size", "1g"]
TINY_MEMORY = "4g"
ARMS = {
    "quota+plan": ["--cpus", "1", "-e", "INTEL_VLLM_CPU_PLAN=1"],
    "quota-plan": ["--cpus", "1", "-e", "INTEL_VLLM_CPU_PLAN=0", "-e", "VLLM_CPU_KVCACHE_SPACE=1"],
    "cpuset": ["--cpuset-cpus", "0"],
    # not run by default: the other CPU as a cpuset, against "cpuset" the noise floor of a pair of
    # alike arms (`--limits-arms cpuset,cpuset1`)
    "cpuset1": ["--cpuset-cpus", "1"],
    # not run by default: the cpuset with the plan's OpenMP setup under a quota (nobind,
    # OMP_NUM_THREADS) instead of vLLM's `auto` binding: against "cpuset", what that setup costs
    # on the same CPU
    "cpuset-nobind": [
        "--cpuset-cpus",
        "0",
        "-e",
        "VLLM_CPU_OMP_THREADS_BIND=nobind",
        "-e",
        "OMP_NUM_THREADS=1",
    ],
    # not run by default: the cpuset with a one-CPU quota on top (the plan sees no quota below
    # the allowed CPUs and leaves vLLM's defaults): against "cpuset", what the quota alone costs
    # on the same CPU, with Docker doing the pinning
    "cpuset-quota": ["--cpuset-cpus", "0", "--cpus", "1"],
}
DEFAULT_ARMS = ["quota+plan", "quota-plan", "cpuset"]
LOADS = {"1 stream": (1, 2048), "8 streams": (8, 1024)}
# On one CPU a real shape writes tokens orders of magnitude slower than the toy (docs/bench.md,
# limits on the 0.5B shape): these keep a measurement to seconds, not minutes.
REAL_LOADS = {"1 stream": (1, 64), "8 streams": (8, 32)}
MODEL_IN_IMAGE = "/opt/vllm-intel/models/tiny-llama"
MOUNTED = "/models/m"  # where an arm sees a real shape, and the name it serves it under


@dataclasses.dataclass(frozen=True)
class Served:
    """What every arm serves, and the load it is measured with."""

    model: str
    docker_args: tuple[str, ...]
    serve_args: tuple[str, ...]
    loads: dict
    label: str = ""  # prefixed to the rows' names ("" for the built-in model)


def served(shape: str | None) -> Served:
    if shape is None:
        return Served(MODEL_IN_IMAGE, ("--memory", TINY_MEMORY), (), LOADS)
    path = real.model(shape)
    # Read once here: the page cache of the weights is then the host's, not billed to the first
    # arm that reads them, whose vLLM counts it as used and, at the plan's edge, finds no room
    # for its KV cache ("Available memory on node 0 ... is less than requested memory for kv").
    for f in sorted(path.rglob("*")):
        if f.is_file():
            with f.open("rb") as fh:
                while fh.read(1 << 24):
                    pass
    flags = list(real.FLAGS)
    edge = f"{plan.least_memory(workload.workload(flags, str(path))) // 2**20}m"
    mount = ("-v", f"{path}:{MOUNTED}:ro", "--memory", edge, "--memory-swap", edge)
    return Served(MOUNTED, mount, (MOUNTED, *flags), REAL_LOADS, f"{shape}, ")


# (cgroup v2 file, v1 controller and file): read from the host through the container's cgroup
# path, so that reading them runs nothing in the container (a `docker exec` bills its cgroup).
CPU_TIME = ("cpu.stat", "cpuacct", "cpuacct.usage")  # v2 usage_usec; v1 nanoseconds
THROTTLE = ("cpu.stat", "cpu", "cpu.stat")  # nr_periods, nr_throttled
PEAK_MEMORY = ("memory.peak", "memory", "memory.max_usage_in_bytes")
MEMORY_STAT = ("memory.stat", "memory", "memory.stat")  # v2 anon / file; v1 total_rss / total_cache
CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")
# what each round records, from Arm.measure's result
FIELDS = {"tps": "tok_s", "cpu_ms": "cpu_ms", "cpu_per_s": "cpu_per_s", "throttled": "throttled"}


class Arm(Container):
    section = "limits"  # in the container's name: vllm-intel-bench-SECTION-PID-KIND

    def __init__(self, kind: str, what: Served):
        self.kind, self.what = kind, what
        name = f"vllm-intel-bench-{self.section}-{os.getpid()}-{kind.replace('+', 'p')}"
        super().__init__(name, IMAGE, self.run_args(), self.command())
        self.tmp = tempfile.mkdtemp(prefix=f"bench-{self.section}-")

    def run_args(self) -> list[str]:
        """`docker run`'s options: the arm's (ARMS) after what every arm gets."""
        return COMMON + list(self.what.docker_args) + ARMS[self.kind]

    def command(self) -> list[str]:
        return ["serve", *self.what.serve_args, "--enforce-eager"]

    def start(self) -> None:
        self.ready_s = round(self.wait_ready(900), 1)
        plan = re.findall(r"\[entrypoint\] (plan:[^\n]*)", self.logs())
        self.plan = plan[0][:300] if plan else "no plan line"
        log(f"{self.kind}: ready in {self.ready_s} s; {self.plan}")
        self.measure(2, 32)  # warm-up

    def _read(self, v2_file: str, v1_controller: str, v1_file: str) -> str | None:
        """A cgroup file of the container, read on the host (cgroup v2, else v1)."""
        pid = docker("inspect", "-f", "{{.State.Pid}}", self.name).stdout.strip()
        for line in pathlib.Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "" and (CGROUP_ROOT / "cgroup.controllers").exists():
                candidate = CGROUP_ROOT / path.lstrip("/") / v2_file
            elif v1_controller in controllers.split(","):
                candidate = CGROUP_ROOT / v1_controller / path.lstrip("/") / v1_file
            else:
                continue
            if candidate.exists():
                return candidate.read_text()
        return None

    def cpu_s(self) -> float:
        """CPU time (user + system) of every process in the container, in seconds."""
        text = self._read(*CPU_TIME)
        if text is None:
            raise RuntimeError(f"{self.kind}: no cgroup CPU accounting file ({CPU_TIME})")
        if "usage_usec" in text:
            return int(re.search(r"usage_usec (\d+)", text).group(1)) / 1e6
        return int(text) / 1e9

    def throttle(self) -> tuple[int, int]:
        """(CFS periods, periods in which the quota ran out and the container was stopped)."""
        text = self._read(*THROTTLE) or ""
        got = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
        return int(got.get("nr_periods", 0)), int(got.get("nr_throttled", 0))

    def peak_mib(self) -> float | None:
        text = self._read(*PEAK_MEMORY)
        return round(int(text) / 2**20) if text else None

    def memory_split_mib(self) -> dict[str, int]:
        """Memory in use now: anonymous (the processes' own) and page cache (files read)."""
        text = self._read(*MEMORY_STAT) or ""
        got = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
        pick = {"anon": ("anon", "total_rss"), "cache": ("file", "total_cache")}
        return {
            name: round(int(next((got[k] for k in keys if k in got), 0)) / 2**20)
            for name, keys in pick.items()
        }

    def idle_cpu_pct(self, seconds: float = 5) -> float:
        """CPU the idle server burns (polling loops, spinning OpenMP threads), % of one CPU."""
        c0, t0 = self.cpu_s(), time.monotonic()
        time.sleep(seconds)
        return round((self.cpu_s() - c0) * 100 / (time.monotonic() - t0), 1)

    def threads(self) -> dict[str, int]:
        """Threads of each process in the container, by process name (the quota's consumers)."""
        code = (
            "import json, psutil\n"
            "print(json.dumps({f'{p.pid} {p.name()}': p.num_threads() for p in psutil.process_iter()}))"
        )
        out = docker("exec", self.name, "/opt/venv/bin/python", "-c", code, check=False)
        return json.loads(out.stdout) if out.returncode == 0 else {}

    def measure(self, n: int, tokens: int) -> dict:
        """tokens/s, CPU ms per token, CPU seconds per second of the round (how much of its limit
        the container used) and the share of CFS periods it was throttled in, for n concurrent
        streams of `tokens` each, one curl process per stream."""
        p0 = self.throttle()
        got = curl_batch(self.url, self.what.model, self.tmp, n, tokens, self.cpu_s)
        p1 = self.throttle()
        if not got["ok"]:
            raise RuntimeError(f"{self.kind}: a stream failed or came back short: {got}")
        got["cpu_per_s"] = round(got["tok_s"] * got["cpu_ms"] / 1000, 3)
        got["throttled"] = round((p1[1] - p0[1]) / max(1, p1[0] - p0[0]), 3)
        return got


@contextlib.contextmanager
def alone(arm: Arm, arms: list[Arm]):
    """Every other arm paused (cgroup freezer) while `arm` is measured: an idle server still polls
    (2-5 % of a CPU), and on this 2-CPU machine that lands on the measured arm's CPU."""
    others = [a for a in arms if a is not arm]
    try:
        for a in others:
            pause(a.name)
        time.sleep(0.5)
        yield
    finally:
        for a in others:
            docker("unpause", a.name, check=False)


def pause(name: str, attempts: int = 5) -> None:
    """`docker pause`, again when the freezer could not stop every task at once (it happens, rarely;
    the CLI's reason is logged)."""
    for k in range(attempts):
        cp = docker("pause", name, check=False)
        if cp.returncode == 0:
            return
        log(f"docker pause {name} failed ({k + 1}/{attempts}): {cp.stderr.strip()[:300]}")
        time.sleep(0.5)
    raise RuntimeError(f"docker pause {name}: {cp.stderr.strip()[:300]}")


def run(
    repeat: int, quick: bool, arms: str | None = None, starts: int = 1, shape: str | None = None
) -> list[Row]:
    """`arms`: comma-separated kinds of ARMS to run (default DEFAULT_ARMS); the rows compare the
    pairs that ran. `starts`: the arms are started this many times (fresh containers, the start
    order rotated), the rounds split between the starts: what differs from one container to the
    next (up to a third of an arm's speed) then varies inside the run and widens its interval,
    instead of fixing the whole run's ratio. `shape`: a real shape instead of the built-in model."""
    kinds = [k.strip() for k in arms.split(",")] if arms else DEFAULT_ARMS
    if unknown := [k for k in kinds if k not in ARMS]:
        raise ValueError(f"unknown limits arm(s) {unknown}; choose from {', '.join(ARMS)}")
    if starts < 1:
        raise ValueError(f"--limits-starts must be at least 1, not {starts}")
    host, why = engine()
    if host is None:
        return [Row("limits", "CPU quota vs cpuset", note=f"not measured: {why}")]
    if (os.cpu_count() or 1) < 2:
        return [Row("limits", "CPU quota vs cpuset", note="not measured: needs 2 CPUs")]
    what = served(shape)
    loads = what.loads
    rounds = 2 if quick else max(4, 2 * repeat)
    per_start = math.ceil(rounds / starts)
    rounds = per_start * starts
    got = {(kind, load): {key: [] for key in FIELDS} for kind in kinds for load in loads}
    out: dict = {key: {kind: [] for kind in kinds} for key in ("ready_s", "peak_mib", "memory_mib")}
    out["start_order"], out["shape"] = [], shape or "tiny-llama"
    k = 0
    for s in range(starts):
        order = kinds[s % len(kinds) :] + kinds[: s % len(kinds)]
        out["start_order"].append(order)
        arms: list[Arm] = []
        try:
            for kind in order:
                arms.append(
                    Arm(kind, what)
                )  # appended first: removed below even if it never gets ready
                arms[-1].start()
            for _ in range(per_start):
                turn = arms[k % len(arms) :] + arms[: k % len(arms)]
                for load, (n, tokens) in loads.items():
                    for a in turn:
                        with alone(a, arms):
                            m = a.measure(n, tokens)
                        log(f"start {s}, round {k}: {a.kind}, {load}: {m}")
                        for key, field in FIELDS.items():
                            got[(a.kind, load)][key].append(m[field])
                k += 1
            for a in arms:
                out["ready_s"][a.kind].append(a.ready_s)
                out["peak_mib"][a.kind].append(a.peak_mib())
                out["memory_mib"][a.kind].append(a.memory_split_mib())
            if s == starts - 1:
                out["plans"] = {a.kind: a.plan for a in arms}
                out["idle_cpu_pct"] = {a.kind: a.idle_cpu_pct() for a in arms}
                out["threads"] = {a.kind: a.threads() for a in arms}
            log(
                f"start {s} (started in the order {', '.join(order)}): peak MiB "
                f"{ {a.kind: out['peak_mib'][a.kind][-1] for a in arms} }, in use (MiB) "
                f"{ {a.kind: out['memory_mib'][a.kind][-1] for a in arms} }"
            )
        finally:
            for a in arms:
                a.remove(keep_log=RESULTS / "logs" / f"limits-{a.name}-start{s}.log")
                shutil.rmtree(a.tmp, ignore_errors=True)
    out.update({f"{kind} {load}": v for (kind, load), v in got.items()})
    log(f"idle CPU %: {out['idle_cpu_pct']}; threads: {out['threads']}")
    record("limits", out)
    rows = []
    names = {
        "quota+plan": "--cpus 1 with the plan",
        "cpuset1": "--cpuset-cpus 1",
        "cpuset-nobind": "cpuset, OpenMP nobind",
        "cpuset-quota": "cpuset with --cpus 1",
    }
    for load in loads:
        for ours_kind, alt_name, goal in (
            ("quota+plan", "cpuset", "ratio >= 0.95"),
            ("quota+plan", "quota-plan", "ratio >= 1.00"),
            ("cpuset1", "cpuset", ""),
            ("cpuset-nobind", "cpuset", ""),
            ("cpuset-quota", "cpuset", ""),
            ("quota+plan", "cpuset-quota", ""),
        ):
            if ours_kind not in kinds or alt_name not in kinds:
                continue
            name, ours, alt = names[ours_kind], got[(ours_kind, load)], got[(alt_name, load)]
            ratios = pair_ratios(ours["tps"], alt["tps"])
            cpu_ratio = statistics.median(pair_ratios(ours["cpu_ms"], alt["cpu_ms"]))
            each = [
                statistics.median(ratios[i : i + per_start])
                for i in range(0, len(ratios), per_start)
            ]
            by_start = f"; median ratio per start {', '.join(f'{r:.2f}' for r in each)}"
            rows.append(
                Row(
                    "limits",
                    f"{what.label}{load}: {name} vs {alt_name}",
                    "tokens/s",
                    ours["tps"],
                    alt["tps"],
                    ratios,
                    goal,
                    None,  # a goal is judged by its interval (bench/__main__.py)
                    note=f"{load} vs {alt_name}: CPU ms per token, median ratio {cpu_ratio:.3f} "
                    f"(ours {statistics.median(ours['cpu_ms']):.2f}, "
                    f"{alt_name} {statistics.median(alt['cpu_ms']):.2f}); CPU s per s "
                    f"{statistics.median(ours['cpu_per_s']):.2f} vs "
                    f"{statistics.median(alt['cpu_per_s']):.2f}; throttled in "
                    f"{statistics.median(ours['throttled']):.0%} vs "
                    f"{statistics.median(alt['throttled']):.0%} of CFS periods; {rounds} rounds"
                    + (by_start if starts > 1 else ""),
                    fmt="{:.0f}",
                )
            )
    return rows
