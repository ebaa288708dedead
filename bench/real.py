"""real: a model of a real model's shape (tools/build_model.py, random weights), ours vs bare
`vllm serve` as upstream ships it (--shutdown-timeout 0, no plugin: VLLM_PLUGINS=none), in
vLLM's default mode (torch.compile), alternated ours / bare.

- ready, cold and warm: each arm gets compile caches of its own for the run (TORCHINDUCTOR_CACHE_DIR,
  VLLM_CACHE_ROOT), so its first start compiles and its next ones reuse what that one compiled;
- tokens/s per stream at 1 / 4 / 16 concurrent streams of 128 tokens, and the time to the first
  token of a single stream;
- the drain: 4 streams of 256 / 512 / 1024 tokens, SIGTERM 5 s after every one flows: how many
  finished with every token. Ours with the default drain (timing.DEFAULT_DRAIN_S); our
  forecast's "the slowest needs N s" beside the real time of the last stream.

Shapes: qwen2.5-0.5b; llama-3.2-1b as well unless --quick (`--real-shapes` chooses). Each drain
run is a start of its own.
"""

from __future__ import annotations

import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from tests.harness import EXIT_FORECAST, ROOT, Streams
from vllm_intel.supervisor import timing

from .common import Row, launch, record, stop

SHAPES_QUICK = ("qwen2.5-0.5b",)
SHAPES = ("qwen2.5-0.5b", "llama-3.2-1b")
STREAMS = (1, 4, 16)
SPEED_TOKENS = 128
DRAIN_STREAMS = 4
DRAIN_TOKENS = (256, 512, 1024)
START_TIMEOUT_S = 1200  # a cold start of the 1 B shape compiles for minutes on 2 cores
# Both arms: the 1 B shape's own 131072-token context needs a 4 GiB KV cache for one request, more
# than the 1 GiB both run with (docs/models.md); every request here is far shorter.
FLAGS = ("--max-model-len", "4096")
# the entrypoint's ready line (reports.cache_verdict): "compile cache hit: 1 graph(s) loaded",
# "... miss: 1 graph(s) compiled", "... partly warm: 1 graph(s) loaded, 1 compiled"
CACHE_LINE = re.compile(
    r"compile cache (?:hit: \d+ graph\(s\) loaded|miss: \d+ graph\(s\) compiled"
    r"|partly warm: \d+ graph\(s\) loaded, \d+ compiled)"
)


def cache_line(text: str) -> str | None:
    """What the start said of its compile cache (ours only: bare vLLM prints no such line)."""
    found = CACHE_LINE.search(text)
    return found.group(0) if found else None


def model(shape: str):
    out = ROOT / "build" / "models-real" / shape
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "build_model.py"), str(out), "--shape", shape],
        check=True,
        capture_output=True,
    )
    return out


def arm_env(kind: str, caches: dict[str, str]) -> dict[str, str]:
    env = {"TORCHINDUCTOR_CACHE_DIR": caches[kind] + "/inductor"}
    env["VLLM_CACHE_ROOT"] = caches[kind] + "/vllm"
    if kind == "bare":
        env["VLLM_PLUGINS"] = "none"
    return env


def speeds(kind: str, shape: str, path, caches, label: str) -> dict:
    """The arm's cold start, then tokens/s per stream at each concurrency, and the TTFT."""
    s, t_ready = launch(
        kind, list(FLAGS), model=path, env=arm_env(kind, caches), name=f"real-{shape}-{kind}-{label}",
        timeout=START_TIMEOUT_S,
    )  # fmt: skip
    try:
        out = {"ready_cold_s": round(t_ready, 1)}
        t0 = time.monotonic()
        one = Streams(s.url, s.model, 1, 16, timeout=300)
        one.wait_started(120)
        out["ttft_s"] = round(time.monotonic() - t0, 3)
        one.join(120)
        for n in STREAMS:
            t0 = time.monotonic()
            results = Streams(s.url, s.model, n, SPEED_TOKENS, timeout=600).join(900)
            rates = [r.tokens / (r.ended - t0) for r in results if r.tokens and r.done]
            out[f"tps_{n}"] = round(statistics.median(rates), 2) if len(rates) == n else "error"
        # Read last: the supervisor's ready line (which says hit or miss) may follow the first 200
        # of /health that ended the wait.
        out["compile_cache"] = cache_line(s.text())
        return record(f"real {shape} {kind} speeds", out)
    finally:
        stop(s)


def drain(kind: str, shape: str, path, caches, tokens: int, label: str) -> dict:
    env = arm_env(kind, caches)
    if kind == "ours":
        env["INTEL_VLLM_DRAIN_TIMEOUT"] = str(timing.DEFAULT_DRAIN_S)
    s, t_ready = launch(
        kind, list(FLAGS), model=path, env=env, name=f"real-{shape}-{kind}-drain{tokens}-{label}",
        timeout=START_TIMEOUT_S,
    )  # fmt: skip
    try:
        streams = Streams(s.url, s.model, DRAIN_STREAMS, tokens, timeout=300)
        streams.wait_flowing(timeout=300)
        time.sleep(5)
        t_term = s.signal(signal.SIGTERM)
        results = streams.join(timeout=timing.grace_period(timing.DEFAULT_DRAIN_S) + 30)
        code = s.wait(timeout=timing.grace_period(timing.DEFAULT_DRAIN_S))
        took = time.monotonic() - t_term if code is not None else "hung"
        finished = sum(
            1 for r in results if r.done and r.finish_reason == "length" and r.tokens == tokens
        )
        need = EXIT_FORECAST.search(s.text())
        return record(
            f"real {shape} {kind} drain {tokens}",
            {
                "ready_warm_s": round(t_ready, 1),
                "compile_cache": cache_line(s.text()),
                "finished": finished,
                # a client still waiting (no end yet) was in flight too: cut without an event
                "in_flight": sum(1 for r in results if not r.ended or r.ended >= t_term),
                "still_waiting": sum(1 for r in results if not r.ended),
                "last_stream_s": round(max(r.ended for r in results) - t_term, 1)
                if all(r.ended for r in results)
                else None,
                "forecast_need_s": int(need["need"]) if need else None,
                "exit_code": code,
                "exit_s": round(took, 1) if isinstance(took, float) else took,
            },
        )
    finally:
        stop(s)


def run(
    repeat: int, quick: bool, shapes: str | None = None, drains: str | None = None
) -> list[Row]:
    rows: list[Row] = []
    chosen = [s.strip() for s in shapes.split(",") if s.strip()] if shapes else None
    lengths = tuple(int(t) for t in drains.split(",") if t.strip()) if drains else DRAIN_TOKENS
    for shape in chosen or (SHAPES_QUICK if quick else SHAPES):
        path = model(shape)
        got: dict[tuple, list[dict]] = {}
        for rep in range(repeat):
            with tempfile.TemporaryDirectory(prefix="bench-real-") as d:
                caches = {"ours": d + "/ours", "bare": d + "/bare"}
                for kind in ("ours", "bare"):
                    got.setdefault((kind, "speeds"), []).append(
                        _safe(speeds, kind, shape, path, caches, str(rep))
                    )
                for tokens in lengths:
                    for kind in ("ours", "bare"):
                        got.setdefault((kind, tokens), []).append(
                            _safe(drain, kind, shape, path, caches, tokens, str(rep))
                        )
        rows += _rows(shape, got, lengths)
    return rows


def _safe(fn, *args) -> dict:
    try:
        return fn(*args)
    except Exception as e:  # one broken run must not cost the others
        return {"error": f"{type(e).__name__}: {e}"[:200]}


def _rows(shape: str, got: dict, lengths: tuple[int, ...] = DRAIN_TOKENS) -> list[Row]:
    def col(kind, key, what="speeds"):
        return [r.get(key, "error") for r in got[(kind, what)]]

    rows = []
    warm = {k: [r.get("ready_warm_s", "error") for t in lengths for r in got[(k, t)]]
            for k in ("ours", "bare")}  # fmt: skip
    for figure, key, unit in (("ready, cold (compiles)", "ready_cold_s", "s"),
                              ("time to first token, 1 stream", "ttft_s", "s"),
                              *((f"tokens/s per stream, {n} streams", f"tps_{n}", "tokens/s")
                                for n in STREAMS)):  # fmt: skip
        rows.append(Row("real", f"{shape}: {figure}", unit, col("ours", key), col("bare", key)))
    rows[0].note = f"ours: {col('ours', 'compile_cache')}"
    said = [r.get("compile_cache") for t in lengths for r in got[("ours", t)]]
    rows.append(Row("real", f"{shape}: ready, warm", "s", warm["ours"], warm["bare"],
                    note=f"ours: {said}"))  # fmt: skip
    for tokens in lengths:
        ours, bare = got[("ours", tokens)], got[("bare", tokens)]
        rows.append(
            Row(
                "real",
                f"{shape}: {DRAIN_STREAMS} x {tokens} tokens at SIGTERM: finished / in flight",
                "",
                [f"{r.get('finished', 'error')}/{r.get('in_flight', '?')}" for r in ours],
                [f"{r.get('finished', 'error')}/{r.get('in_flight', '?')}" for r in bare],
                note=f"ours: last stream {[r.get('last_stream_s') for r in ours]} s after SIGTERM, "
                f"forecast {[r.get('forecast_need_s') for r in ours]} s, exit "
                f"{[r.get('exit_code') for r in ours]} after {[r.get('exit_s') for r in ours]} s; "
                f"bare: exit {[r.get('exit_code') for r in bare]} after "
                f"{[r.get('exit_s') for r in bare]} s"
                + "".join(f"; {r['error']}" for r in ours + bare if "error" in r),
            )
        )
    return rows
