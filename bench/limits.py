"""limits: the CPU image under a CPU quota vs the same CPU count as a cpuset, with and without the
CPU plan (Docker only).

Three containers of the image (`serve --enforce-eager`, `--shm-size 1g --memory 4g`), started one
after the other and then all running at once:
- quota+plan:  `--cpus 1` (a quota smaller than the 2-CPU affinity set), the plan as shipped;
- quota-plan:  `--cpus 1 -e INTEL_VLLM_CPU_PLAN=0` (vLLM's own thread choice; KV cache 1 GiB);
- cpuset:      `--cpuset-cpus 0` (the same one CPU as a cpuset; the plan has nothing to change).
The load alternates between them round by round (rotating the order), so the machine's drift hits
all three alike: one 256-token stream, then 8 concurrent 128-token streams. Per round and arm:
tokens/s (client side, first request sent to last byte) and the container's CPU time per generated
token (cgroup v2 `cpu.stat` usage_usec or v1 `cpuacct.usage`: every process in it), which a busy
neighbour disturbs far less than wall time. Ratios per round: quota+plan / cpuset (goal >= 0.95)
and quota+plan / quota-plan (goal >= 1: the plan is never slower than vLLM's defaults).
Also per arm: time to ready, peak memory (cgroup), the CPU an idle server burns, and the threads
of every process in it: where a quota goes.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time

from tests.harness import Container, Streams

from .common import RESULTS, Row, log, pair_ratios, record
from .dockerutil import IMAGE, docker, engine

# Every arm gets the same memory limit: the plan sizes the KV cache from it (4 GiB -> 1 GiB).
# The plan-off arm is vLLM's thread choice with the same 1 GiB KV cache: with nothing set, vLLM
# reserves 92 % of the node's memory (--gpu-memory-utilization) and cannot start next to another
# server (seen: "Available memory on node 0 (18.15/21.84 GiB) ... is less than desired").
COMMON = ["--shm-size", "1g", "--memory", "4g"]
ARMS = {
    "quota+plan": ["--cpus", "1"],
    "quota-plan": ["--cpus", "1", "-e", "INTEL_VLLM_CPU_PLAN=0", "-e", "VLLM_CPU_KVCACHE_SPACE=1"],
    "cpuset": ["--cpuset-cpus", "0"],
}
LOADS = {"1 stream": (1, 256), "8 streams": (8, 128)}
MODEL_IN_IMAGE = "/opt/vllm-intel/models/tiny-llama"
# cgroup v2 file and field, then v1's cpuacct (nanoseconds), as seen from inside the container
CPU_TIME = (
    ("/sys/fs/cgroup/cpu.stat", "usage_usec", 1),
    ("/sys/fs/cgroup/cpuacct/cpuacct.usage", None, 1e-3),
)
PEAK_MEMORY = ("/sys/fs/cgroup/memory.peak", "/sys/fs/cgroup/memory/memory.max_usage_in_bytes")


class Arm(Container):
    def __init__(self, kind: str):
        self.kind = kind
        name = f"vllm-intel-bench-limits-{os.getpid()}-{kind.replace('+', 'p')}"
        super().__init__(name, IMAGE, COMMON + ARMS[kind], ["serve", "--enforce-eager"])

    def start(self) -> None:
        self.ready_s = round(self.wait_ready(900), 1)
        plan = re.findall(r"\[entrypoint\] (plan:[^\n]*)", self.logs())
        self.plan = plan[0][:300] if plan else "no plan line"
        log(f"{self.kind}: ready in {self.ready_s} s; {self.plan}")
        Streams(self.url, MODEL_IN_IMAGE, 2, 32).join(300)  # warm-up

    def _read(self, path: str) -> str | None:
        out = docker("exec", self.name, "cat", path, check=False)
        return out.stdout if out.returncode == 0 else None

    def cpu_usec(self) -> float:
        """CPU time (user + system) of every process in the container, in microseconds."""
        for path, field, to_usec in CPU_TIME:
            text = self._read(path)
            if text is not None:
                value = re.search(rf"{field} (\d+)", text).group(1) if field else text.strip()
                return int(value) * to_usec
        raise RuntimeError(f"{self.kind}: no cgroup CPU accounting file ({CPU_TIME})")

    def peak_mib(self) -> float | None:
        for path in PEAK_MEMORY:
            text = self._read(path)
            if text is not None:
                return round(int(text) / 2**20)
        return None

    def idle_cpu_pct(self, seconds: float = 5) -> float:
        """CPU the idle server burns (polling loops, spinning OpenMP threads), % of one CPU."""
        c0, t0 = self.cpu_usec(), time.monotonic()
        time.sleep(seconds)
        return round((self.cpu_usec() - c0) / 1e4 / (time.monotonic() - t0), 1)

    def threads(self) -> dict[str, int]:
        """Threads of each process in the container, by process name (the quota's consumers)."""
        code = (
            "import json, psutil\n"
            "print(json.dumps({f'{p.pid} {p.name()}': p.num_threads() for p in psutil.process_iter()}))"
        )
        out = docker("exec", self.name, "/opt/venv/bin/python", "-c", code, check=False)
        return json.loads(out.stdout) if out.returncode == 0 else {}

    def measure(self, n: int, tokens: int) -> tuple[float, float]:
        """(tokens/s, CPU ms per token) of n concurrent streams of `tokens` each."""
        c0, t0 = self.cpu_usec(), time.monotonic()
        res = Streams(self.url, MODEL_IN_IMAGE, n, tokens, timeout=300).join(900)
        took = max(r.ended for r in res) - t0
        c1 = self.cpu_usec()
        bad = [r for r in res if not (r.done and r.tokens == tokens)]
        if bad:
            raise RuntimeError(f"{self.kind}: incomplete streams {bad[:2]}")
        return n * tokens / took, (c1 - c0) / 1000 / (n * tokens)


def run(repeat: int, quick: bool) -> list[Row]:
    host, why = engine()
    if host is None:
        return [Row("limits", "CPU quota vs cpuset", note=f"not measured: {why}")]
    if (os.cpu_count() or 1) < 2:
        return [Row("limits", "CPU quota vs cpuset", note="not measured: needs 2 CPUs")]
    rounds = 2 if quick else max(4, 2 * repeat)
    arms: list[Arm] = []
    try:
        for kind in ARMS:
            arms.append(Arm(kind))  # appended first: removed below even if it never gets ready
            arms[-1].start()
        got = {(a.kind, load): {"tps": [], "cpu_ms": []} for a in arms for load in LOADS}
        for k in range(rounds):
            order = arms[k % 3 :] + arms[: k % 3]
            for load, (n, tokens) in LOADS.items():
                for a in order:
                    tps, cpu_ms = a.measure(n, tokens)
                    got[(a.kind, load)]["tps"].append(tps)
                    got[(a.kind, load)]["cpu_ms"].append(cpu_ms)
        out = {f"{kind} {load}": v for (kind, load), v in got.items()}
        out["plans"] = {a.kind: a.plan for a in arms}
        out["ready_s"] = {a.kind: a.ready_s for a in arms}
        out["peak_mib"] = {a.kind: a.peak_mib() for a in arms}
        out["idle_cpu_pct"] = {a.kind: a.idle_cpu_pct() for a in arms}
        out["threads"] = {a.kind: a.threads() for a in arms}
        log(f"idle CPU %: {out['idle_cpu_pct']}; peak MiB: {out['peak_mib']}")
        log(f"threads: {out['threads']}")
        record("limits", out)
    finally:
        for a in arms:
            a.remove(keep_log=RESULTS / "logs" / f"limits-{a.name}.log")
    rows = []
    for load in LOADS:
        qp, qd, cs = (got[(kind, load)] for kind in ARMS)
        for alt_name, alt, goal, threshold in (
            ("cpuset", cs, "ratio >= 0.95", 0.95),
            ("quota-plan", qd, "ratio >= 1.00", 1.0),
        ):
            ratios = pair_ratios(qp["tps"], alt["tps"])
            cpu_ratio = statistics.median(pair_ratios(qp["cpu_ms"], alt["cpu_ms"]))
            rows.append(
                Row(
                    "limits",
                    f"{load}: --cpus 1 with the plan vs {alt_name}",
                    "tokens/s",
                    qp["tps"],
                    alt["tps"],
                    ratios,
                    goal,
                    statistics.median(ratios) >= threshold,
                    note=f"{load} vs {alt_name}: CPU ms per token, median ratio {cpu_ratio:.3f} "
                    f"(ours {statistics.median(qp['cpu_ms']):.2f}, "
                    f"{alt_name} {statistics.median(alt['cpu_ms']):.2f}); {rounds} rounds",
                    fmt="{:.0f}",
                )
            )
    return rows
