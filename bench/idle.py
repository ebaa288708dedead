"""idle: SIGTERM to exit of an idle server in a container, ours vs Docker's default alternative.

Ours: a container of vllm-intel:cpu as shipped (entrypoint.py is PID 1), `serve --enforce-eager`.
Alternative: a container of the same image with `--entrypoint sh` running
`sh -c 'vllm serve MODEL --enforce-eager; exit $?'`: sh is PID 1 and does not forward SIGTERM
(the kernel drops it for PID 1 without a handler), so `docker stop` SIGKILLs after its default 10 s.
(A bare `sh -c 'vllm serve ...'` would not show it: dash execs the last command, making vLLM PID 1.)
Both are stopped with plain `docker stop` (Docker's default timeout). Without an engine or image:
ours is measured locally (entrypoint.py, SIGTERM to exit) and the alternative is "not measured".
"""

from __future__ import annotations

import os
import re
import signal
import time

from tests.harness import Container

from .common import RESULTS, Row, launch, pair_ratios, record, stop
from .dockerutil import IMAGE, docker, engine

MODEL_IN_IMAGE = "/opt/vllm-intel/models/tiny-llama"


def container(kind: str, label: str) -> dict:
    run_args = ["--shm-size", "2g", "-e", "VLLM_CPU_KVCACHE_SPACE=1"]
    if kind == "ours":
        args, cmd = run_args, ["serve", "--enforce-eager"]
    else:
        args = run_args + ["--entrypoint", "sh"]
        cmd = ["-c", f"vllm serve {MODEL_IN_IMAGE} --enforce-eager; exit $?"]
    c = Container(f"vllm-intel-bench-{os.getpid()}-{kind}-{label}", IMAGE, args, cmd)
    try:
        t_ready = c.wait_ready(600)
        time.sleep(2)
        t = time.monotonic()
        docker("stop", c.name, timeout=120)
        took = time.monotonic() - t
        code = int(docker("inspect", "-f", "{{.State.ExitCode}}", c.name).stdout.strip())
        m = re.search(
            r"\[entrypoint\] exit \d+: vLLM .* ([0-9.]+) s after the stop request", c.logs()
        )
        out = {
            "kind": kind,
            "ready_s": round(t_ready, 1),
            "stop_s": round(took, 2),
            "exit_code": code,
            "vllm_exit_s": float(m.group(1)) if m else None,
        }
        record("idle docker stop", out)
        return out
    finally:
        c.remove(keep_log=RESULTS / "logs" / f"idle-{kind}-{label}.log")


def local(label: str) -> dict:
    s, _ = launch("ours", ["--enforce-eager"], name=f"idle-local-{label}")
    try:
        time.sleep(2)
        t = s.signal(signal.SIGTERM)
        code = s.wait(60)
        out = {
            "stop_s": round(time.monotonic() - t, 2) if code is not None else "hung",
            "exit_code": code,
        }
        record("idle local", out)
        return out
    finally:
        stop(s)


def run(repeat: int, quick: bool) -> list[Row]:
    host, why = engine()
    if host is None:
        ours = [local(str(i)) for i in range(repeat)]
        return [
            Row(
                "idle",
                "idle SIGTERM -> exit (local entrypoint.py; no Docker)",
                "s",
                [r["stop_s"] for r in ours],
                ["not measured"],
                [],
                "ours <= 2 s",
                all(isinstance(r["stop_s"], float) and r["stop_s"] <= 2 for r in ours),
                note=f"Docker alternative not measured: {why}",
            )
        ]
    ours, alt = [], []
    for rep in range(repeat):
        ours.append(container("ours", str(rep)))
        alt.append(container("sh", str(rep)))
    o, a = [r["stop_s"] for r in ours], [r["stop_s"] for r in alt]
    return [
        Row(
            "idle",
            "idle `docker stop` -> exited (default timeout)",
            "s",
            o,
            a,
            pair_ratios(o, a),
            "ours <= 2 s",
            all(v <= 2 for v in o),
            note=f"{IMAGE}; exit codes ours {[r['exit_code'] for r in ours]}, `sh -c` PID 1 "
            f"{[r['exit_code'] for r in alt]} (137 = SIGKILL); ours: vLLM itself exited "
            f"after {[r['vllm_exit_s'] for r in ours]} s (supervisor's log); "
            "time to /health: ours "
            f"{[r['ready_s'] for r in ours]}, alternative {[r['ready_s'] for r in alt]}",
        )
    ]
