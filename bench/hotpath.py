"""python -m bench.hotpath ROUNDS: what the plugin's own code adds on vLLM's hot path, in ns.

Run by section patches under the vLLM venv, in a process of its own (it applies patches). Where
the plugin's code runs while tokens are generated, apart from shm-busy-sleep (which replaces
vLLM's wait and has its own arm):
- the engine core's busy loop calls ``EngineCoreProc._handle_shutdown`` once per pass, wrapped by
  drain-deadline and engine-parent-watch: at most one pass per generated token while requests run
  (every step gives each running request a token);
- the API server sends every SSE event through drain-deadline's ASGI layer
  (``RefuseWhileDraining``): one event per token, plus the request's own bookkeeping.
Each round times both with the real patched code and with vLLM's own, alternated (the order
flips every round), on the real classes of the installed vLLM: per call of the loop's check and per
event of a stream of STREAM_EVENTS events (the bench's stream length, so the per-request cost is
spread as it is when serving). Prints one JSON object: per-round added ns for each.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import sys
import time
import types

CALLS = 200_000
STREAM_EVENTS = 2000


def per_call_ns(fn, arg, n: int = CALLS) -> float:
    t = time.perf_counter_ns()
    for _ in range(n):
        fn(arg)
    return (time.perf_counter_ns() - t) / n


def per_event_ns(app, loop) -> float:
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        pass

    t = time.perf_counter_ns()
    loop.run_until_complete(app(scope, receive, send))
    return (time.perf_counter_ns() - t) / STREAM_EVENTS


async def stream_app(scope, receive, send):
    """An endpoint streaming STREAM_EVENTS SSE events, as vLLM's completions stream does."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    event = b'data: {"choices":[{"text":" x","index":0}]}\n\n'
    for _ in range(STREAM_EVENTS):
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def main(rounds: int) -> dict:
    from vllm.v1.engine.core import EngineCoreProc, EngineShutdownState

    from vllm_intel.patches import drain_deadline, engine_parent_watch

    multiprocessing.current_process().name = "EngineCore"  # where engine-parent-watch applies
    vllm_check = EngineCoreProc._handle_shutdown
    states = [p.apply() for p in (drain_deadline.PATCH, engine_parent_watch.PATCH)]
    assert states == ["applied", "applied"], states
    our_check = EngineCoreProc._handle_shutdown
    engine = types.SimpleNamespace(
        shutdown_state=EngineShutdownState.RUNNING,
        vllm_config=types.SimpleNamespace(shutdown_timeout=30),
    )
    our_app = drain_deadline.RefuseWhileDraining(stream_app)
    loop = asyncio.new_event_loop()
    per_event_ns(our_app, loop), per_call_ns(our_check, engine, 1000)  # warm-up
    out = {"check_ns": [], "event_ns": [], "vllm_check_ns": [], "vllm_event_ns": []}
    for k in range(rounds):
        order = [(True, False), (False, True)][k % 2]
        for ours in order:
            check = per_call_ns(our_check if ours else vllm_check, engine)
            event = per_event_ns(our_app if ours else stream_app, loop)
            out["check_ns" if ours else "vllm_check_ns"].append(check)
            out["event_ns" if ours else "vllm_event_ns"].append(event)
    out["stream_events"] = STREAM_EVENTS
    out["added_check_ns"] = [a - b for a, b in zip(out["check_ns"], out["vllm_check_ns"])]
    out["added_event_ns"] = [a - b for a, b in zip(out["event_ns"], out["vllm_event_ns"])]
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)))
