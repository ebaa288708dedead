"""entrypoint.py serving the tiny model with real vLLM CPU: drain, refusal, deadline, leftovers.

Each test starts its own server (~25-60 s on 2 cores); they are marked slow and vllm.
"""

from __future__ import annotations

import json
import re
import signal
import time

import pytest
import requests

from tests.deploy.test_monitoring import dashboard_queries
from tests.harness import (
    EXIT_FORECAST,
    Senders,
    Streams,
    free_port,
    prometheus,
    threads_of,
)

from .conftest import assert_nothing_left, probe

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
TOKENS = 3000
SENDERS = 4  # clients sending short requests back to back through SIGTERM


def test_sigterm_mid_stream_drains_every_request(serve, tmp_path):
    """vLLM's default mode (torch.compile), the probe port on and Debian's Prometheus scraping
    vLLM's and the supervisor's /metrics every second: every query of the Grafana dashboard
    returns data from the serving server; 8 streams in flight at SIGTERM and requests sent back
    to back through it all end whole or refused; after the stop the supervisor's series say what
    its exit line says (none aborted, the stop finished)."""
    probe_port = free_port()
    env = {"INTEL_VLLM_PROBE_PORT": str(probe_port), "INTEL_VLLM_METRICS_LINGER_S": "2"}
    s = serve(env=env)
    targets = {"vllm": [f"127.0.0.1:{s.port}"], "vllm-intel": [f"127.0.0.1:{probe_port}"]}
    with prometheus.running(tmp_path, targets) as scraper:
        drain_and_check(s, scraper)
    # The ready line splits the start into vLLM's own phases (read by the plugin in its
    # processes), and gives vLLM's own count of the graphs it compiled or loaded from its cache.
    ready = re.search(r"ready after [\d.]+ s \(vLLM: ([^)]*)\)", s.text())
    assert ready, s.tail()
    timed, _, verdict = ready.group(1).partition("; ")
    words = {part.rsplit(" ", 2)[0] for part in timed.split(", ")}
    assert words == {"load", "engine init", "compile"}, ready
    assert verdict.startswith("compile cache "), ready


def dashboard_answers(scraper) -> None:
    """Every dashboard query returns data (the throttling one where this host's cgroup counts
    CFS periods: not every cgroup v2 has the cpu controller on)."""
    assert scraper.until("count(up == 1)", 2, 30) == 2, "Prometheus never scraped both"
    # every vLLM process reported its patch states to the supervisor's /metrics
    kinds = scraper.query('count by (process) (vllm_intel_patch_state{patch="drain-deadline"})')
    assert {k["metric"]["process"] for k in kinds or []} >= {"API server", "EngineCore"}, kinds
    throttling = scraper.value("count(vllm_intel_cpu_periods_total)") is not None
    for title, expr in dashboard_queries():
        if "throttled" in expr and not throttling:
            continue
        end = time.monotonic() + 20
        while not scraper.query(expr) and time.monotonic() < end:
            time.sleep(0.5)
        assert scraper.query(expr), (title, expr)


def drain_and_check(s, scraper) -> None:
    # SIGTERM once vLLM counts all 8 running; 3000 tokens each then take 10-15 s on 2 cores
    # (1600-2600 tokens/s over 8 streams), well inside the 30 s window and long enough for the
    # supervisor's first /metrics sample to see them in flight.
    dashboard_answers(scraper)  # before the streams: must not eat into the work left at SIGTERM
    streams = Streams(s.url, s.model, n=8, max_tokens=TOKENS)
    senders = Senders(s.url, s.model, n=SENDERS)
    streams.wait_running(s.url, timeout=60)
    t_term = s.signal(signal.SIGTERM)
    time.sleep(0.5)
    assert probe(s, "ready") == 1  # out of rotation while draining
    t0 = time.monotonic()
    refused = requests.post(
        s.url + "/v1/completions",
        timeout=10,
        json={"model": s.model, "prompt": "x", "max_tokens": 5},
    )
    assert refused.status_code == 503 and time.monotonic() - t0 < 2
    results = streams.join()
    sent = senders.join()
    code = s.wait(timeout=60)
    print(
        f"exit {code} {time.monotonic() - t_term:.1f} s after SIGTERM; "
        f"last stream ended {max(r.ended for r in results) - t_term:.1f} s after it"
    )
    assert [r.done and r.finish_reason == "length" and r.tokens == TOKENS for r in results] == [
        True
    ] * 8, results
    # Requests sent back to back through SIGTERM: each one is served in full or refused with 503
    # before any work; none is cut (a 500, or `abort` with no token, would fail here).
    print(f"sent through SIGTERM: {sent}")
    assert len(sent) >= 2 and any(r[0] == 503 for r in sent), sent
    assert all(r == (200, 8) or r[0] == 503 for r in sent), sent
    assert code == 0, s.tail()
    # The 8 streams end together right before vLLM exits, where the supervisor's /metrics
    # samples (one per tick) can miss them: the counts are vLLM's API server's own, one per
    # request's end, and say what the clients got. In flight: the 8 streams and at most one request of each sender
    # (one accepted just before SIGTERM); every one of them finished.
    in_flight, finished, aborted = exit_counts(s.text())
    assert 8 <= in_flight <= 8 + SENDERS and (finished, aborted) == (in_flight, 0), s.tail()
    # The drain forecast (API server, from vLLM's request states): every stream fits the window.
    forecast = EXIT_FORECAST.search(s.text())
    assert forecast, s.tail()
    assert int(forecast["in_flight"]) >= 8 and forecast["cut"] == "0", forecast.group(0)
    assert float(forecast["need"]) < 28, forecast.group(0)  # 10-15 s of work were left
    assert re.search(r"drain forecast: \d+ request\(s\) in flight.*: all finish", s.text())
    assert_nothing_left(s)
    # What the exit line says, in the series Prometheus scraped from the probe port
    # (last_over_time: the supervisor is gone, its series are stale now).
    last = lambda name: scraper.value(f"last_over_time({name}[1m])")  # noqa: E731
    assert last('vllm_intel_drains_total{outcome="finished"}') == 1
    assert last("vllm_intel_drain_in_flight_requests") == in_flight
    assert last("vllm_intel_drain_finished_requests") == finished
    assert last("vllm_intel_drain_aborted_requests") == 0
    assert last("vllm_intel_drain_forecast_cut_requests") == 0


def exit_counts(text: str) -> tuple[int, int, int]:
    """(in flight, finished, aborted) of the exit line, as vLLM's API server counted them; none
    failed, none still running."""
    found = re.search(
        r"; (\d+) in flight at SIGTERM, (\d+) finished, (\d+) aborted "
        r"\(as counted by vLLM's API server\)",
        text,
    )
    assert found, text[-3000:]
    return tuple(int(n) for n in found.groups())


def test_request_longer_than_the_drain_gets_a_final_event(serve):
    """Also INTEL_VLLM_LOG_FORMAT=json: every line of the run (start, a request, an aborting
    drain, stop) is one JSON object: the supervisor's, vLLM's logging and uvicorn's access log,
    vLLM's all before the exit line. With the probe port on too, every extension that can run
    here is on, and PID 1 still runs 3 threads (the relay is pumped by the loop)."""
    env = {"INTEL_VLLM_LOG_FORMAT": "json", "INTEL_VLLM_PROBE_PORT": str(free_port())}
    s = serve("--enforce-eager", drain=4, env=env)
    streams = Streams(s.url, s.model, n=1, max_tokens=8000)
    streams.wait_running(s.url, timeout=60)
    threads = threads_of(s.pid)
    assert len(threads) <= 3, threads
    t_term = s.signal(signal.SIGTERM)
    (result,) = streams.join(timeout=60)
    code = s.wait(timeout=4 + 10 + 2)
    took = time.monotonic() - t_term
    print(
        f"long request: {result.tokens} tokens, finish {result.finish_reason}, exit {code} "
        f"after {took:.1f} s"
    )
    assert result.terminal and result.done, result
    assert result.finish_reason == "abort", result
    # Said at SIGTERM, before it happened: this one request does not fit the 4 s window.
    forecast = EXIT_FORECAST.search(s.text())
    assert forecast and forecast.group("in_flight", "cut") == ("1", "1"), s.tail()
    assert re.search(r"drain forecast: 1 request\(s\) in flight.*1 will be cut at 3 s", s.text())
    assert result.ended - t_term < 4 + 1
    # The abort ends the drain: vLLM exits right after it, yet the exit line counts it.
    assert exit_counts(s.text()) == (1, 0, 1)
    assert code is not None and took <= 4 + 10, s.tail()
    assert_nothing_left(s)
    records = [json.loads(line) for line in s.text().splitlines()]  # every line, or this raises
    assert all({"time", "level", "source", "event", "message"} <= r.keys() for r in records)
    loggers = {r.get("logger", "").split(".")[0] for r in records if r["source"] == "vllm"}
    assert {"vllm", "uvicorn"} <= loggers, loggers
    (exit_at,) = [i for i, r in enumerate(records) if r["event"] == "exit"]
    assert records[exit_at]["code"] == code
    after = [r["message"] for r in records[exit_at + 1 :] if r["source"] != "entrypoint"]
    assert not after, after  # vLLM's last lines came before the exit line
    assert any(
        "POST /v1/completions" in r["message"]
        for r in records
        if r.get("logger") == "uvicorn.access"
    )
