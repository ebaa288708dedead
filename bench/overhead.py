"""overhead: what the supervisor costs at start. entrypoint.py serve vs bare `vllm serve`, same model,
same flags (--enforce-eager), the plugin loaded in both: only the supervisor differs.

Time to ready varies +-10 % from start to start on 2 busy cores, so the direct ratio needs many
pairs to resolve 3 %. Beside it, the supervisor's own part, measured per start with little noise:
the time from the entrypoint's start to vLLM's process start (psutil create times: the preflight,
the plan, the spawn) plus every CPU second the supervisor used until /health answered (at most the
time it took from vLLM's processes, on a busy machine). Its ratio is 1 + that part / the paired bare
start: how much later than bare vLLM ours would be ready if vLLM itself started alike."""

from __future__ import annotations

import signal
import time

import psutil

from .common import Row, cpu_s, launch, pair_ratios, record, rss_kb, stop, tree_rss_kb

SETTLE_S = 3  # after /health answers, before reading RSS: both variants alike


def own_part(pid: int) -> dict:
    """The supervisor's part of a start: its start -> vLLM's start, its CPU seconds so far."""
    sup = psutil.Process(pid)
    child = sup.children()[0]
    cpu = sup.cpu_times()
    return {
        "spawn_s": round(child.create_time() - sup.create_time(), 3),
        "supervisor_cpu_s": round(cpu.user + cpu.system, 3),
    }


def warm_up() -> None:
    """One start of each, not counted: the first start after an install or a build reads the
    venv from disk (about 3x a later start), which only one variant pays."""
    for kind in ("ours", "bare"):
        s, t_ready = launch(kind, ["--enforce-eager"], name=f"overhead-{kind}-warm-up")
        stop(s)
        record(f"overhead {kind} warm-up (not counted)", {"ready_s": round(t_ready, 2)})


def one(kind: str, label: str) -> dict:
    s, t_ready = launch(kind, ["--enforce-eager"], name=f"overhead-{kind}-{label}")
    try:
        cpu = cpu_s(s.pid)  # right at ready: an idle server still polls
        time.sleep(SETTLE_S)
        out = {
            "kind": kind,
            "ready_s": round(t_ready, 2),
            "cpu_to_ready_s": round(cpu, 2),
            **(own_part(s.pid) if kind == "ours" else {}),
            "tree_rss_mb": tree_rss_kb(s.pid) / 1024,
            "top_rss_mb": rss_kb(s.pid) / 1024,
        }
        t = s.signal(signal.SIGTERM)
        code = s.wait(30)
        out["idle_stop_s"] = round(time.monotonic() - t, 2) if code is not None else "hung"
        out["exit_code"] = code
        record(f"overhead {kind}", out)
        return out
    finally:
        stop(s)


def run(repeat: int, quick: bool) -> list[Row]:
    # At least 6 pairs: fewer give no 95 % interval (bench/stats.py). A B, B A, ...: neither
    # variant always starts right after the other's teardown.
    pairs = 1 if quick else max(6, 2 * repeat)
    ours, bare = [], []
    if not quick:
        warm_up()
    for k in range(pairs):
        for kind in ("ours", "bare")[:: 1 if k % 2 == 0 else -1]:
            (ours if kind == "ours" else bare).append(one(kind, str(k)))

    def paired(key: str, figure: str, unit: str, **extra) -> Row:
        """ours vs bare for one recorded figure, judged by the interval of its paired ratios."""
        o, b = [r[key] for r in ours], [r[key] for r in bare]
        ratios = pair_ratios(o, b)
        # no ratios (a failed start): not met; else judged by its interval (bench/__main__.py)
        return Row(
            "overhead",
            figure,
            unit,
            o,
            b,
            ratios,
            "ratio <= 1.03",
            None if ratios else False,
            **extra,
        )

    bare_ready = [r["ready_s"] for r in bare]
    part = [r["spawn_s"] + r["supervisor_cpu_s"] for r in ours]
    rows = [
        paired("ready_s", "time to ready (/health 200)", "s"),
        paired(
            "cpu_to_ready_s",
            "CPU time to ready: every process of the tree, user + system, at /health 200",
            "s",
            note="the work a start does, without the waits that make its wall time spread",
        ),
        Row(
            "overhead",
            "time to ready, the supervisor's own part (start -> vLLM started, + its CPU until ready)",
            "s",
            part,
            bare_ready,
            [1 + p / x for p, x in zip(part, bare_ready)],
            "ratio <= 1.03",
            None,  # judged by its interval (bench/__main__.py)
            note="ratio: 1 + part / the paired bare time to ready; start -> vLLM started "
            f"{[r['spawn_s'] for r in ours]} s, supervisor CPU {[r['supervisor_cpu_s'] for r in ours]} s",
        ),
        paired("tree_rss_mb", "RSS of the process tree (sum of VmRSS)", "MB", fmt="{:.0f}"),
    ]
    sup = [r["top_rss_mb"] for r in ours]
    rows.append(
        Row(
            "overhead",
            "supervisor process RSS (entrypoint.py VmRSS)",
            "MB",
            sup,
            [],
            [],
            "< 40 MB",
            all(v < 40 for v in sup),
            fmt="{:.1f}",
            note="alternative: no supervisor",
        )
    )
    o, b = [r["idle_stop_s"] for r in ours], [r["idle_stop_s"] for r in bare]
    rows.append(
        Row(
            "overhead",
            "idle SIGTERM -> exit (local, no container)",
            "s",
            o,
            b,
            pair_ratios(o, b),
            "",
            None,
            note=f"exit codes ours {[r['exit_code'] for r in ours]}, "
            f"alternative {[r['exit_code'] for r in bare]}",
        )
    )
    return rows
