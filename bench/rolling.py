"""rolling: a rolling restart of 2 replicas behind HAProxy under client load, what the clients see.

Both arms: compose.yaml + compose.replicas.yaml (2 CPU replicas, `--enforce-eager`,
the LB image with deploy/haproxy/haproxy.cfg), the client load of tests/harness/rolling.py (LOAD: 2
threads of 256-token streams, 2 of 16-token completions, 2 of ~10 s streams, on the LB's 127.0.0.1 port; drain
DRAIN_S), 15 s of steady state,
then `scripts/rolling-restart.sh`, then 5 s more.
- ours: the image as shipped (entrypoint.py drains on SIGTERM);
- alternative: bench/compose.bare-vllm.yaml: bare `vllm serve` as PID 1, no patch plugin.
One run per arm whatever --repeat says (each takes ~4-6 min on 2 cores). Latencies: client-side,
from sending the request to its last byte, of the successful requests that started in the steady
window vs during the rolling restart.
"""

from __future__ import annotations

import os

from tests.harness import build_image
from tests.harness.rolling import DRAIN_S, LB_DRAIN_S, LOAD, Deployment, rollout, summary

from .common import ROOT, Row, log, record
from .dockerutil import IMAGE, engine


def one(kind: str) -> dict:
    dep = Deployment(
        IMAGE,
        "vllm-intel:lb",
        f"vllm-intel-bench-rolling-{os.getpid()}-{kind}",
        bare=kind == "bare",
        drain=DRAIN_S,
        lb_drain=LB_DRAIN_S,
        log_dir=ROOT / "bench" / "results" / "logs",
    )
    try:
        dep.up()
        result = rollout(dep, warm_s=15, after_s=5, **LOAD)
    finally:
        dep.down()
    log(summary(result))
    result.pop("restart_output")
    return record(f"rolling {kind}", result)


def run(repeat: int, quick: bool) -> list[Row]:
    host, why = engine()
    if host is None:
        return [
            Row("rolling", "rolling restart", "", [], [], [], "", None, note=f"not measured: {why}")
        ]
    build, _ = build_image("lb")
    if build.returncode != 0:
        raise RuntimeError(f"build-image.sh lb failed: {build.stderr[-500:]}")
    ours, bare = one("ours"), one("bare")
    rows = [
        Row(
            "rolling",
            "2 replicas restarted under load: failed / sent",
            "requests",
            [f"{ours['failed']}/{ours['total']}"],
            [f"{bare['failed']}/{bare['total']}"],
            [],
            "ours 0 failed",
            ours["failed"] == 0 and ours["hung"] == 0,
            note=f"streams failed ours {ours['failed_streams']}/{ours['streams']}, alternative "
            f"{bare['failed_streams']}/{bare['streams']}; short ours {ours['failed_shorts']}/"
            f"{ours['shorts']}, alternative {bare['failed_shorts']}/{bare['shorts']}; "
            f"in flight at each SIGTERM (ours) {ours['in_flight_at_sigterm']}; requests the LB "
            f"replayed: ours {ours['lb_replayed']}, alternative {bare['lb_replayed']}",
        )
    ]
    for kind, tokens in (("short", LOAD["short_tokens"]), ("stream", LOAD["stream_tokens"])):
        for q in ("p50", "p99"):

            def cellv(r, q=q, kind=kind):
                s, d = r["latency"][kind]["steady"][q], r["latency"][kind]["restart"][q]
                return f"{s:.2f} -> {d:.2f}" if s is not None and d is not None else "-"

            rows.append(
                Row(
                    "rolling",
                    f"{kind} ({tokens} tokens) latency {q}: steady -> during restart",
                    "s",
                    [cellv(ours)],
                    [cellv(bare)],
                    [],
                )
            )
    rows.append(
        Row(
            "rolling",
            "rolling restart of 2 replicas (script wall time)",
            "s",
            [ours["restart_s"]],
            [bare["restart_s"]],
            [ours["restart_s"] / bare["restart_s"]] if bare["restart_s"] else [],
            fmt="{:.0f}",
        )
    )
    return rows
