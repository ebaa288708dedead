"""drain: N streams cut by SIGTERM mid-generation, entrypoint.py vs bare `vllm serve` (default flags).

Ours: `entrypoint.py serve MODEL --enforce-eager` (drain 30 s, the plugin loaded).
Alternative: `vllm serve MODEL --enforce-eager` as upstream ships it: --shutdown-timeout 0 and no
plugin (VLLM_PLUGINS=none). Its streams are cut and it may wait for clients to give up: clients
time out after CLIENT_TIMEOUT_S without a byte, and a server still up EXIT_BOUND_S after SIGTERM is
killed and recorded as "hung".
"""

from __future__ import annotations

import re
import signal
import time

from tests.harness import Streams
from vllm_intel.supervisor import timing

from .common import Row, launch, record, stop

CLIENT_TIMEOUT_S = 30
EXIT_BOUND_S = timing.grace_period(timing.DEFAULT_DRAIN_S)  # the orchestrator grace period
# Tokens per stream: each N lasts a few seconds (tiny model, eager, 2 busy cores).
MAX_TOKENS = {1: 3000, 8: 1000, 32: 320}


def one(kind: str, n: int, label: str) -> dict:
    env = {"VLLM_PLUGINS": "none"} if kind == "bare" else {}
    max_tokens = MAX_TOKENS.get(n, max(300, 8000 // n))
    s, _ = launch(kind, ["--enforce-eager"], env=env, name=f"drain-{kind}-n{n}-{label}")
    try:
        streams = Streams(s.url, s.model, n, max_tokens, timeout=CLIENT_TIMEOUT_S)
        streams.wait_flowing(timeout=120)
        t_term = s.signal(signal.SIGTERM)
        results = streams.join(timeout=CLIENT_TIMEOUT_S + 15)
        code = s.wait(timeout=max(t_term + EXIT_BOUND_S - time.monotonic(), 0))
        t_exit = time.monotonic() - t_term if code is not None else None
        before = sum(1 for r in results if r.ended and r.ended < t_term)
        completed = sum(
            1
            for r in results
            if r.ended >= t_term
            and r.done
            and r.finish_reason == "length"
            and r.tokens == max_tokens
        )
        told = sum(1 for r in results if r.ended >= t_term and r.done)
        timed_out = sum(
            1 for r in results if r.error and re.search(r"timeout|timed out", r.error, re.I)
        )
        last = max(r.ended for r in results) - t_term
        out = {
            "n": n,
            "kind": kind,
            "max_tokens": max_tokens,
            "in_flight": n - before,
            "completed": completed,
            "finish_reasons": sorted({str(r.finish_reason) for r in results}),
            "done_event": told,
            "client_timeouts": timed_out,
            "exit_code": code,
            "exit_s": round(t_exit, 2) if t_exit is not None else "hung",
            "last_stream_s": round(last, 2),
            "gap_s": round(t_exit - last, 2) if t_exit is not None else "hung",
        }
        m = re.search(
            r"\[entrypoint\] exit \d+: vLLM .* ([0-9.]+) s after the stop request", s.text()
        )
        out["vllm_exit_s"] = float(m.group(1)) if m else None  # the supervisor's own view
        record(f"drain {kind} N={n}", out)
        return out
    finally:
        stop(s)


def run(repeat: int, quick: bool) -> list[Row]:
    ns = (1, 8) if quick else (1, 8, 32)
    runs: dict[tuple, list[dict]] = {}
    for rep in range(repeat):
        for n in ns:
            for kind in ("ours", "bare"):  # A/B/A/B: drift hits both alike
                try:
                    out = one(kind, n, str(rep))
                except Exception as e:  # one broken run must not cost the others
                    out = record(f"drain {kind} N={n}", {"error": f"{type(e).__name__}: {e}"[:200]})
                runs.setdefault((kind, n), []).append(out)
    rows = []
    for n in ns:
        ours, bare = runs[("ours", n)], runs[("bare", n)]

        def pct(r):
            if "error" in r:
                return "error"
            return 100.0 * r["completed"] / r["in_flight"] if r["in_flight"] else 0.0

        def get(r, key):
            return r.get(key, "error")

        rows.append(
            Row(
                "drain",
                f"N={n}: completed / in flight",
                "%",
                [pct(r) for r in ours],
                [pct(r) for r in bare],
                [],
                "ours 100 %",
                all(pct(r) == 100 for r in ours),
                note=f"{MAX_TOKENS.get(n)} tokens/stream; alternative: streams ended with [DONE] "
                f"{[get(r, 'done_event') for r in bare]}, finish reasons "
                f"{[get(r, 'finish_reasons') for r in bare]}, client timeouts "
                f"{[get(r, 'client_timeouts') for r in bare]}",
                fmt="{:.0f}",
            )
        )
        ox, bx = [get(r, "exit_s") for r in ours], [get(r, "exit_s") for r in bare]
        rows.append(
            Row(
                "drain",
                f"N={n}: SIGTERM -> exit",
                "s",
                ox,
                bx,
                [],
                "",
                None,
                note=f"exit codes ours {[get(r, 'exit_code') for r in ours]}, "
                f"alternative {[get(r, 'exit_code') for r in bare]}; ours: vLLM "
                "itself exited after "
                f"{[get(r, 'vllm_exit_s') for r in ours]} s (supervisor's log)",
            )
        )
        og, bg = [get(r, "gap_s") for r in ours], [get(r, "gap_s") for r in bare]
        rows.append(
            Row(
                "drain",
                f"N={n}: exit - last stream end",
                "s",
                og,
                bg,
                [],
                "ours <= 1 s",
                all(isinstance(g, float) and g <= 1 for g in og),
                note="last stream end (s after SIGTERM; a client gives up after 30 s without a byte): ours "
                f"{[get(r, 'last_stream_s') for r in ours]}, alternative "
                f"{[get(r, 'last_stream_s') for r in bare]}",
            )
        )

        errors = [r["error"] for r in ours + bare if "error" in r]
        if errors:
            rows[-1].note += f"; failed runs: {errors}"
    return rows
