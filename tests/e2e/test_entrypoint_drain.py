"""entrypoint.py serving the tiny model with real vLLM CPU: drain, refusal, deadline, leftovers.

Each test starts its own server (~25-60 s on 2 cores); they are marked slow and vllm.
"""

from __future__ import annotations

import re
import signal
import time

import pytest
import requests

from tests.harness import Senders, Streams

from .conftest import assert_nothing_left, probe

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
TOKENS = 3000
# The supervisor's exit line, from the forecast drain-deadline wrote at SIGTERM.
FORECAST = re.compile(
    r"forecast at SIGTERM: (\d+) in flight, the slowest needing (\d+) s of the \d+ s window, "
    r"(\d+) to be cut"
)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_sigterm_mid_stream_drains_every_request(serve, mode):
    s = serve(*(["--enforce-eager"] if mode == "eager" else []))
    # SIGTERM once vLLM counts all 8 running; 3000 tokens each then take 10-15 s on 2 cores
    # (1600-2600 tokens/s over 8 streams), well inside the 30 s window and long enough for the
    # supervisor's first /metrics sample to see them in flight.
    streams = Streams(s.url, s.model, n=8, max_tokens=TOKENS)
    senders = Senders(s.url, s.model, n=4) if mode == "eager" else None
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
    sent = senders.join() if senders else []
    code = s.wait(timeout=60)
    print(
        f"{mode}: exit {code} {time.monotonic() - t_term:.1f} s after SIGTERM; "
        f"last stream ended {max(r.ended for r in results) - t_term:.1f} s after it"
    )
    assert [r.done and r.finish_reason == "length" and r.tokens == TOKENS for r in results] == [
        True
    ] * 8, results
    # Requests sent back to back through SIGTERM: each one is served in full or refused with 503
    # before any work; none is cut (a 500, or `abort` with no token, would fail here).
    if senders:
        print(f"sent through SIGTERM: {sent}")
        assert len(sent) >= 2 and any(r[0] == 503 for r in sent), sent
        assert all(r == (200, 8) or r[0] == 503 for r in sent), sent
    assert code == 0, s.tail()
    # /metrics is sampled every 0.5 s until vLLM stops answering; the sample after the last
    # stream normally lands inside vLLM's teardown, else the line says what was still running.
    summary = re.search(
        r"(\d+) in flight at SIGTERM, (\d+) finished, 0 aborted(, (\d+) still running)?", s.text()
    )
    assert summary, s.tail()
    in_flight, finished, running = (int(g or 0) for g in summary.group(1, 2, 4))
    if not senders:  # the senders' short requests come and go between two samples
        assert in_flight == 8 and finished + running == 8, summary.group(0)
    # The drain forecast (API server, from vLLM's request states): every stream fits the window.
    forecast = FORECAST.search(s.text())
    assert forecast, s.tail()
    assert int(forecast.group(1)) >= 8 and forecast.group(3) == "0", forecast.group(0)
    assert float(forecast.group(2)) < 28, forecast.group(0)  # 10-15 s of work were left
    assert re.search(r"drain forecast: \d+ request\(s\) in flight.*: all finish", s.text())
    assert_nothing_left(s)


def test_request_longer_than_the_drain_gets_a_final_event(serve):
    s = serve("--enforce-eager", drain=4)
    streams = Streams(s.url, s.model, n=1, max_tokens=8000)
    streams.wait_running(s.url, timeout=60)
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
    forecast = FORECAST.search(s.text())
    assert forecast and forecast.group(1, 3) == ("1", "1"), s.tail()
    assert re.search(r"drain forecast: 1 request\(s\) in flight.*1 will be cut at 3 s", s.text())
    assert result.ended - t_term < 4 + 1
    assert code is not None and took <= 4 + 10, s.tail()
    assert_nothing_left(s)


def test_idle_sigterm_exits_fast(serve):
    s = serve("--enforce-eager")
    t_term = s.signal(signal.SIGTERM)
    code = s.wait(timeout=30)
    took = time.monotonic() - t_term
    print(f"idle stop: exit {code} after {took:.2f} s")
    assert code == 0 and took < 3, s.tail()
    assert "forecast at SIGTERM: nothing in flight" in s.text(), s.tail()
    assert_nothing_left(s)
