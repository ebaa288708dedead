"""The drain on a model of a real model's size (Qwen2.5-0.5B's shape, random weights, built
offline by tools/build_model.py): the default drain window fits answers in flight at SIGTERM at
the speed this size gets on a small CPU host, and the forecast says so before they end.

The toy model writes thousands of tokens a second, so it cannot show whether the window fits real
generation speeds: on 2 cores this shape writes ~10-12 tokens/s per stream with 4 streams, and a
512-token answer in flight at SIGTERM needs ~45 s (the former 30 s default cut all four).
"""

from __future__ import annotations

import re
import signal
import time

import pytest

from tests.harness import Streams
from vllm_intel.supervisor import timing

from .conftest import assert_nothing_left

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.real_shape]


def test_default_drain_finishes_four_512_token_answers_on_a_half_billion_model(serve, real_model):
    model = real_model("qwen2.5-0.5b")
    # eager: a start in ~25 s instead of ~75-150 s (compiling 24 layers); generation is a little
    # slower than compiled (10 against 12 tokens/s per stream), so the window is tried harder.
    t = time.monotonic()
    s = serve("--enforce-eager", drain=timing.DEFAULT_DRAIN_S, model=str(model))
    ready = time.monotonic() - t
    streams = Streams(s.url, s.model, n=4, max_tokens=512, timeout=300)
    streams.wait_running(s.url, timeout=60)
    time.sleep(5)  # answers well under way, as a stop meets them
    t_term = s.signal(signal.SIGTERM)
    results = streams.join(timeout=300)
    code = s.wait(timeout=timing.grace_period(timing.DEFAULT_DRAIN_S))
    took = time.monotonic() - t_term
    forecast = re.search(
        r"forecast at SIGTERM: (\d+) in flight, the slowest needing (\d+) s of the (\d+) s "
        r"window, (\d+) to be cut",
        s.text(),
    )
    last = max(r.ended for r in results) - t_term
    print(
        f"0.5B shape: ready {ready:.0f} s; 4 x 512 tokens, last ended {last:.1f} s after SIGTERM, "
        f"exit {code} after {took:.1f} s; {forecast.group(0) if forecast else 'no forecast'}"
    )
    assert [(r.done, r.finish_reason, r.tokens) for r in results] == [(True, "length", 512)] * 4
    assert code == 0, s.tail()
    assert forecast, s.tail()
    in_flight, need, window, cut = map(int, forecast.groups())
    assert (in_flight, window, cut) == (4, timing.DEFAULT_DRAIN_S, 0), forecast.group(0)
    # The forecast is the drain's real length, within a few seconds either way.
    assert abs(need - last) < max(5, 0.25 * last), (need, last)
    assert_nothing_left(s)
