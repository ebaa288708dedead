"""memory: what the CPU plan's runtime allowance (plan.runtime_bytes) has to hold, measured on
models of real shapes in the CPU image (Docker only).

One container per shape (`serve`, torch.compile, `--memory 8g --shm-size 1g`, the plan's KV cache
from that limit), its memory read on the host from the container's cgroup every 0.2 s: anonymous
memory plus shared memory (v2 anon + shmem; v1 total_rss + total_shmem: what the kernel cannot
drop to make room, so what an OOM kill counts; page cache is left out, the kernel reclaims it).
From the start, through a prefill-heavy load (8 prompts of 1500 tokens at once) and a wide decode
(32 streams at once: the sampler's logits over the whole vocabulary for each), the peak is taken.

    runtime = peak - weights (the model's safetensors) - KV cache (the plan's) - /dev/shm in use

The KV cache is allocated filled with zeros at start (vLLM's allocate_kv_cache: torch.zeros), so
every page of it is resident from then on: its memory at full use is its memory at start, and
the figure holds at any KV use. Against the allowance for that model: runtime /
plan.runtime_bytes (goal <= 1).
"""

from __future__ import annotations

import os
import re
import time

from tests.harness import Container
from tests.harness.memory import SAMPLE_S, Sampler, burst, resident
from vllm_intel.supervisor import plan as plan_module
from vllm_intel.supervisor import workload

from .common import Row, log, record
from .dockerutil import IMAGE, docker, engine
from .real import SHAPES, SHAPES_QUICK, model

MEMORY = "8g"
PREFILL = (8, 1500, 16)  # requests at once, prompt tokens, tokens out
DECODE = (32, 16, 48)
GiB = 2**30


def measure(shape: str) -> dict:
    path = model(shape)
    name = f"vllm-intel-bench-memory-{os.getpid()}-{shape}"
    args = ["--memory", MEMORY, "--shm-size", "1g", "-v", f"{path}:/models/m:ro",
            "-e", "INTEL_VLLM_MODEL=/models/m"]  # fmt: skip
    with Container(name, IMAGE, args, ["serve", "--max-model-len", "4096"]) as c:
        with Sampler(name) as sampler:
            ready_s = c.wait_ready(1500)
            at_ready = resident(sampler.path) or 0
            sampler.phase = "prefill"
            prefilled = burst(c.url, "/models/m", *PREFILL)
            sampler.phase = "decode"
            decoded = burst(c.url, "/models/m", *DECODE)
            time.sleep(2 * SAMPLE_S)
            shm = docker("exec", name, "du", "-sb", "/dev/shm").stdout.split()[0]
        logs = c.logs()
    kv = re.search(r"KV cache: (\d+) GiB", logs)
    if not kv:
        raise RuntimeError(f"no KV cache in the plan line: {logs[-2000:]}")
    kv_bytes, w = int(kv.group(1)) * GiB, workload.weights_bytes(str(path))
    runtime = sampler.peak - w - kv_bytes - int(shm)
    return record(
        f"memory {shape}",
        {
            "ready_s": round(ready_s, 1),
            "served": f"{prefilled}/{PREFILL[0]} prefill, {decoded}/{DECODE[0]} decode",
            "peak_gib": round(sampler.peak / GiB, 2),
            # weights + KV resident before any request: the KV cache is in memory from the start
            "at_ready_gib": round(at_ready / GiB, 2),
            "peak_during": sampler.peak_at,
            "weights_gib": round(w / GiB, 2),
            "kv_gib": kv_bytes // GiB,
            "shm_mib": round(int(shm) / 2**20),
            "runtime_gib": round(runtime / GiB, 2),
        },
    )


def run(repeat: int, quick: bool) -> list[Row]:
    host, why = engine()
    if host is None:
        log(f"memory: skipped: {why}")
        return []
    rows = []
    for shape in SHAPES_QUICK if quick else SHAPES:
        work = workload.workload([], str(model(shape)))
        allowance = round(plan_module.runtime_bytes(work) / GiB, 2)
        got = []
        for _ in range(repeat):
            try:
                got.append(measure(shape))
            except Exception as e:  # one broken run must not cost the others
                got.append({"error": f"{type(e).__name__}: {e}"[:200]})
        runtime = [g.get("runtime_gib", "error") for g in got]
        rows.append(
            Row(
                "memory",
                f"{shape}: runtime (peak - weights - KV - shm) vs the allowance",
                "GiB",
                runtime,
                [allowance] * len(got),
                ratio=[r / allowance for r in runtime if isinstance(r, float)],
                goal="<= 1",
                met=all(isinstance(r, float) and r <= allowance for r in runtime),
                note="; ".join(
                    f"peak {g.get('peak_gib')} GiB during {g.get('peak_during')} "
                    f"({g.get('at_ready_gib')} at ready), weights "
                    f"{g.get('weights_gib')}, KV {g.get('kv_gib')}, shm {g.get('shm_mib')} MiB, "
                    f"served {g.get('served')}" + (f"; {g['error']}" if "error" in g else "")
                    for g in got
                ),
            )
        )
    return rows
