"""stall: how long 8 concurrent streams wait for their first byte when the host has no CPU to
spare, the shm readers sleeping (ours: the CPU plan's VLLM_SHM_BROADCAST_BUSY_SLEEP_S) vs
spinning (vLLM's default: the same entrypoint with the variable set to 0, which the plan keeps).

Each arm is one server (`entrypoint.py serve`, compiled) that serves `BATCHES` batches of 8
streaming completions started together by 8 `curl` processes (common.curl_streams: curl's own
clock for the first byte, independent of a Python client's GIL). Per batch: the slowest stream's
time to first byte, and the batch's tokens/s. The arms alternate A B per repeat.

Only meaningful where vLLM's `auto` OpenMP binding leaves fewer than two CPUs beside its threads
(e.g. 2 cores): there the plan turns the sleep on (`entrypoint.py plan` says so); elsewhere both
arms spin alike unless under a CPU quota.
"""

from __future__ import annotations

import shutil
import statistics

from .common import Row, curl_streams, launch, log, pair_ratios, record, stop, terminate

STREAMS = 8
SPIN = "VLLM_SHM_BROADCAST_BUSY_SLEEP_S"


def arm(kind: str, label: str, batches: int, tokens: int) -> dict:
    env = {SPIN: "0"} if kind == "spin" else {}
    s, _ = launch("ours", [], name=f"stall-{kind}-{label}", env=env)
    try:
        plan = next((ln for ln in s.text().splitlines() if "[entrypoint] plan:" in ln), "")
        runs = [curl_streams(s, STREAMS, tokens) for _ in range(batches)]
        out = {
            "kind": kind,
            "plan_sets_sleep": f"{SPIN}=0.0001" in plan,
            "batches": runs,
            "worst_first_byte_s": max(
                (r["worst_first_byte_s"] for r in runs if r["ok"]), default=None
            ),
            "tok_s": statistics.median([r["tok_s"] for r in runs if r["ok"]] or [0]),
            "failed_batches": sum(not r["ok"] for r in runs),
            "exit_code": terminate(s),
        }
        record("stall", out)
        log(f"stall {kind} {label}: {out['worst_first_byte_s']} s, {out['tok_s']} tok/s")
        return out
    finally:
        stop(s)


def run(repeat: int, quick: bool) -> list[Row]:
    if shutil.which("curl") is None:
        return [Row("stall", "not measured", note="needs curl", met=False)]
    batches, tokens = (2, 1000) if quick else (5, 2000)
    ours, alt = [], []
    for rep in range(repeat):
        ours.append(arm("sleep", str(rep), batches, tokens))
        alt.append(arm("spin", str(rep), batches, tokens))
    ow, aw = [r["worst_first_byte_s"] for r in ours], [r["worst_first_byte_s"] for r in alt]
    ot, at = [r["tok_s"] for r in ours], [r["tok_s"] for r in alt]
    sets = [r["plan_sets_sleep"] for r in ours]
    note = (
        f"{STREAMS} curl streams x {tokens} tokens, {batches} batches per server; the plan set the "
        f"sleep on this host: {sets} (if not, both arms spin: no difference to show); failed "
        f"batches ours {[r['failed_batches'] for r in ours]}, alternative "
        f"{[r['failed_batches'] for r in alt]}"
    )
    return [
        Row(
            "stall",
            "slowest first byte of 8 concurrent streams (worst batch per server)",
            "s",
            ow,
            aw,
            pair_ratios(ow, aw),
            "ours <= 1 s",
            all(v is not None and v <= 1 for v in ow),
            note=note,
        ),
        Row(
            "stall",
            "tokens/s of 8 concurrent streams (median batch per server)",
            "tok/s",
            ot,
            at,
            pair_ratios(ot, at),
            "ratio >= 1",
            bool(ot) and statistics.median(pair_ratios(ot, at) or [0]) >= 1,
            fmt="{:.0f}",
        ),
    ]
