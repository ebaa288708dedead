"""limits: the CPU image under a CPU quota vs the same CPU count as a cpuset, with and without the
CPU plan (Docker only).

Three containers of the image (`serve --enforce-eager`, `--shm-size 1g`), started one after the
other and then all running at once:
- quota+plan:  `--cpus 1` (a quota smaller than the 2-CPU affinity set), the plan as shipped;
- quota-plan:  `--cpus 1 -e INTEL_VLLM_CPU_PLAN=0` (vLLM's own thread choice);
- cpuset:      `--cpuset-cpus 0` (the same one CPU as a cpuset; the plan has nothing to change).
The load alternates between them round by round (rotating the order), so the machine's drift hits
all three alike: one 256-token stream, then 8 concurrent 128-token streams. Per round and arm:
tokens/s (client side, first request sent to last byte) and the container's CPU time per generated
token (cgroup `cpu.stat` usage_usec, user + system of every process in it), which a busy
neighbour disturbs far less than wall time. Ratios per round: quota+plan / cpuset (goal >= 0.95)
and quota+plan / quota-plan (goal >= 1: the plan is never slower than vLLM's defaults).
"""

from __future__ import annotations

import os
import re
import statistics
import time

import requests

from tests.harness import Streams, free_port

from .common import RESULTS, Row, log, pair_ratios, record
from .dockerutil import IMAGE, docker, engine

ARMS = {
    "quota+plan": ["--cpus", "1"],
    "quota-plan": ["--cpus", "1", "-e", "INTEL_VLLM_CPU_PLAN=0"],
    "cpuset": ["--cpuset-cpus", "0"],
}
LOADS = {"1 stream": (1, 256), "8 streams": (8, 128)}
MODEL_IN_IMAGE = "/opt/vllm-intel/models/tiny-llama"


class Arm:
    def __init__(self, kind: str):
        self.kind, self.port = kind, free_port()
        self.name = f"vllm-intel-bench-limits-{os.getpid()}-{kind.replace('+', 'p')}"
        docker(
            "run",
            "-d",
            "--name",
            self.name,
            "--shm-size",
            "1g",
            "-p",
            f"127.0.0.1:{self.port}:8000",
            *ARMS[kind],
            IMAGE,
            "serve",
            "--enforce-eager",
        )
        self.url = f"http://127.0.0.1:{self.port}"
        t0 = time.monotonic()
        while time.monotonic() - t0 < 900:
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if docker("inspect", "-f", "{{.State.Running}}", self.name).stdout.strip() != "true":
                raise RuntimeError(f"{kind} exited:\n{self.logs()[-2000:]}")
            time.sleep(1)
        else:
            raise TimeoutError(f"{kind} not ready after 900 s")
        self.ready_s = round(time.monotonic() - t0, 1)
        plan = re.findall(r"\[entrypoint\] (plan:[^\n]*)", self.logs())
        self.plan = plan[0][:300] if plan else "no plan line"
        log(f"{kind}: ready in {self.ready_s} s; {self.plan}")
        Streams(self.url, MODEL_IN_IMAGE, 2, 32).join(300)  # warm-up

    def logs(self) -> str:
        out = docker("logs", self.name, check=False)
        return out.stdout + out.stderr

    def cpu_usec(self) -> int:
        stat = docker("exec", self.name, "cat", "/sys/fs/cgroup/cpu.stat").stdout
        return int(re.search(r"usage_usec (\d+)", stat).group(1))

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

    def remove(self) -> None:
        (RESULTS / "logs").mkdir(parents=True, exist_ok=True)
        (RESULTS / "logs" / f"limits-{self.name}.log").write_text(self.logs())
        docker("rm", "-f", self.name, check=False)


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
            arms.append(Arm(kind))
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
        record("limits", out)
    finally:
        for a in arms:
            a.remove()
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
