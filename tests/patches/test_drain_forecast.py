"""The drain forecast (vllm_intel.in_vllm.drain_forecast): the arithmetic, what it reads of vLLM's own
request state, and the file the supervisor reads. The live numbers are asserted by tests/e2e
(test_entrypoint_drain: a drain that fits says so, one that does not says it cuts)."""

from __future__ import annotations

import dataclasses
import json
import os
import types

import pytest

from vllm_intel.in_vllm import drain_forecast as df
from vllm_intel.in_vllm import run_files

F = df.InFlight


def test_all_finish_when_the_slowest_fits():
    got = df.forecast([F(100, 612, 12.0), F(100, 400, 10.0)], window_s=90, cut_at_s=88)
    # 512 / 12 = 42.7 s, 300 / 10 = 30 s; median rate 11
    assert (got.in_flight, got.tokens_left, got.cut, got.unknown) == (2, 812, 0, 0)
    assert got.need_s == pytest.approx(512 / 12) and got.rate == pytest.approx(11.0)
    assert got.line().endswith("the slowest needs 43 s of the 90 s window: all finish")


def test_counts_the_requests_the_window_cuts():
    reqs = [F(0, 512, 12.0), F(400, 512, 12.0), F(10, 2000, 12.0)]
    got = df.forecast(reqs, window_s=30, cut_at_s=28)
    # 42.7 s and 165 s are past 28 s; 112/12 = 9.3 s is not
    assert got.cut == 2 and got.need_s == pytest.approx(1990 / 12)
    assert "2 will be cut at 28 s" in got.line()


def test_a_request_without_a_rate_gets_the_median_of_the_others():
    got = df.forecast([F(0, 600, None), F(50, 100, 10.0), F(50, 100, 30.0)], 30, 28)
    assert got.rate == 20.0 and got.need_s == pytest.approx(600 / 20) and got.cut == 1


def test_no_rate_at_all_or_no_max_tokens_is_unknown_never_a_guess():
    got = df.forecast([F(0, 600, None)], 30, 28)
    assert (got.need_s, got.cut, got.unknown) == (None, 0, 1)
    assert "time needed unknown" in got.line()
    got = df.forecast([F(5, None, 10.0), F(5, 100, 10.0)], 30, 28)
    assert got.tokens_left is None and got.unknown == 1 and "slowest known" in got.line()


def test_nothing_in_flight():
    got = df.forecast([], 90, 88)
    assert got.in_flight == 0 and got.line() == "drain forecast: nothing in flight"


def test_speed_is_measured_between_the_two_samples():
    # no engine stamps (None): the tokens between over the time between the samples
    before = {"a": (100, 512, None), "b": (10, 2000, None), "c": (5, 20, None), "d": (0, 600, None)}
    after = {"a": (112, 512, None), "b": (22, 2000, None), "d": (0, 600, None)}  # c done; d waits
    reqs = df.in_flight(before, after, elapsed=1.0)
    assert reqs == [F(112, 512, 12.0), F(22, 2000, 12.0), F(20, 20, None), F(0, 600, None)]
    got = df.forecast(reqs, window_s=90, cut_at_s=88, elapsed=1.0)
    # a: 1 + 400/12 = 34 s; b: 1 + 1978/12 = 166 s (cut); c: done; d: 1 + 600/12 = 51 s
    assert got.cut == 1 and got.need_s == pytest.approx(1 + 1978 / 12) and got.unknown == 0
    assert got.tokens_left == 400 + 1978 + 0 + 600


def test_speed_is_timed_by_the_engines_stamps_of_the_tokens_not_by_the_samples():
    """9 tokens a second sampled 1 s apart: the clock alone sees 8 or 10 tokens depending on where
    the samples fall (off by up to 1/8); the stamps of the first and last token give 9 exactly."""
    before = {"a": (100, 512, 50.00), "b": (7, 512, 49.95)}
    after = {"a": (108, 512, 50.8889), "b": (17, 512, 51.0611)}  # 8 and 10 tokens in the 1 s
    got = df.in_flight(before, after, elapsed=1.0)
    assert [round(r.rate, 2) for r in got] == [9.0, 9.0]
    # a stamp that did not move (or none after) falls back to the samples' clock
    got = df.in_flight({"a": (100, 512, 50.0)}, {"a": (110, 512, 50.0)}, elapsed=2.0)
    assert got[0].rate == 5.0


def test_samples_the_fields_of_vllms_own_request_state():
    """The attributes sample() reads exist in this vLLM: RequestState sets them in its __init__,
    and RequestStateStats is the dataclass that counts the tokens."""
    import ast
    import inspect

    from vllm.v1.engine.output_processor import RequestState
    from vllm.v1.metrics.stats import RequestStateStats

    assigned = {
        t.attr
        for n in ast.walk(ast.parse(inspect.getsource(RequestState.__init__).lstrip()))
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Attribute)
    }
    assert {"max_tokens_param", "stats"} <= assigned
    fields = {f.name for f in dataclasses.fields(RequestStateStats)}
    assert {"num_generation_tokens", "last_token_ts"} <= fields

    stats = RequestStateStats(arrival_time=0.0)
    stats.num_generation_tokens = 101
    stats.last_token_ts = 12.5
    states = {
        "r1": types.SimpleNamespace(max_tokens_param=512, stats=stats),
        # --disable-log-stats: no stats object, so no count; no max_tokens: unbounded
        "r2": types.SimpleNamespace(max_tokens_param=None, stats=None),
    }
    assert df.sample(states) == {"r1": (101, 512, 12.5), "r2": (None, None, None)}
    got = df.in_flight(df.sample(states), df.sample(states), elapsed=1.0)
    assert got == [F(101, 512, None), F(0, None, None)]  # no token between: no speed


def test_written_then_read_back(tmp_path):
    found = df.forecast([F(0, 512, 12.0)], 30, 28)
    df.write(found, env={run_files.ENV: str(tmp_path)})
    assert df.read(tmp_path) == found
    assert [p.name for p in tmp_path.iterdir()] == [run_files.FORECAST]  # no temporary left
    df.write(found, env={})  # unset: nothing written, nothing raised


def test_a_write_the_disk_cannot_hold_leaves_no_file(tmp_path, monkeypatch):
    """A full disk mid-write (ENOSPC from the file's write): the report is lost, never the
    process, and nothing half-written stays in the run directory."""

    def full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run_files.json, "dump", full)
    run_files.write(str(tmp_path / run_files.FORECAST), {"in_flight": 1})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "kind", ["missing", "symlink", "fifo", "too-big", "not-json", "wrong-keys", "bool"]
)
def test_read_refuses_what_is_not_a_forecast(tmp_path, kind):
    path = tmp_path / run_files.FORECAST
    good = dataclasses.asdict(df.forecast([F(0, 512, 12.0)], 30, 28))
    if kind == "symlink":
        (tmp_path / "real").write_text(json.dumps(good))
        path.symlink_to(tmp_path / "real")
    elif kind == "fifo":
        os.mkfifo(path)  # read() must not block on it
    elif kind == "too-big":
        path.write_text(json.dumps({**good, "pad": "x" * run_files.MAX_BYTES}))
    elif kind == "not-json":
        path.write_bytes(b"\xff\x00")
    elif kind == "wrong-keys":
        path.write_text(json.dumps({"in_flight": 1}))
    elif kind == "bool":
        path.write_text(json.dumps({**good, "cut": True}))
    assert df.read(tmp_path) is None


def test_report_samples_twice_without_delaying_the_drain(tmp_path, monkeypatch):
    """drain-deadline's report_forecast returns at once; a timer thread takes the second sample
    while the requests go on, then logs and writes the forecast."""
    import time

    from vllm_intel.patches.drain_deadline import report_forecast

    path = tmp_path / run_files.FORECAST
    monkeypatch.setenv(run_files.ENV, str(tmp_path))
    stats = types.SimpleNamespace(num_generation_tokens=10)
    processor = types.SimpleNamespace(
        request_states={"r": types.SimpleNamespace(max_tokens_param=1000, stats=stats)}
    )
    t0 = time.monotonic()
    report_forecast(processor, timeout=4)  # cut at 3 s; second sample 1 s later
    assert time.monotonic() - t0 < 0.1 and not path.exists()
    stats.num_generation_tokens = 110  # 100 tokens in ~1 s: 990 left need ~10 s, past 3 s
    deadline = time.monotonic() + 5
    while df.read(tmp_path) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    got = df.read(tmp_path)
    assert got is not None and (got.in_flight, got.cut, got.cut_at_s) == (1, 1, 3.0)
    assert 80 < got.rate < 101 and 9 < got.need_s < 14


# -- how the drain ended: drain-deadline counts each request's final event ------------------------


def test_the_tally_counts_each_request_once_by_its_first_end(tmp_path):
    """Ends before the drain's start are not its; an error raised into a request that already
    had its end changes nothing (the client got the end); a request that reached vLLM after the
    start (accepted before it) is in flight too. Each call leaves the counts in the file."""
    env = {run_files.ENV: str(tmp_path)}
    tally = df.Tally(env)
    tally.end(["x"], "finished", ["a", "b", "c"])
    assert df.read_result(tmp_path) is None
    tally.begin({"a": 1, "b": 2, "c": 3})  # vLLM's request_states
    assert df.read_result(tmp_path) == df.Result(3, 0, 0, 0, 3)
    tally.end(["a"], "finished", ["b", "c"])
    tally.end(["b"], "aborted", ["c"])
    tally.end(["c"], "failed", ["c"])  # propagate_error: vLLM still holds it
    tally.end(["c"], "finished", [])  # its end arrives after the error: the error stands
    tally.end(["d"], "finished", [])
    got = df.read_result(tmp_path)
    assert got == df.Result(in_flight=4, finished=2, aborted=1, failed=1, open=0)
    assert got.brief() == "4 in flight at SIGTERM, 2 finished, 1 aborted, 1 failed"
    tally.begin({})  # vLLM's second shutdown call: the drain's start stays the first one's
    assert df.read_result(tmp_path) == got
    assert df.Result(2, 1, 0, 0, 1).brief() == (
        "2 in flight at SIGTERM, 1 finished, 0 aborted, 1 still running"
    )


def test_every_end_in_vllms_output_processor_is_counted(tmp_path, monkeypatch):
    """drain-deadline's hooks on vLLM's own OutputProcessor: the engine's finish (length) and
    abort (the drain deadline's), an abort in the API server (a client gone) and an error raised
    into what is still open are each counted, from the drain's start only."""
    import time

    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector

    from vllm_intel.patches import drain_deadline as dd

    monkeypatch.setattr(dd, "TALLY", df.Tally({run_files.ENV: str(tmp_path)}))
    processor = OutputProcessor(None, log_stats=False)

    def add(rid):
        params = SamplingParams(max_tokens=5, detokenize=False, output_kind=RequestOutputKind.DELTA)
        request = EngineCoreRequest(
            rid, [1, 2, 3], None, params, None, time.time(), None, None, None, external_req_id=rid
        )
        processor.add_request(
            request, None, None, 0, RequestOutputCollector(params.output_kind, rid)
        )

    def out(rid, reason=None):
        return EngineCoreOutput(rid, [7], finish_reason=reason)

    try:
        dd.PATCH._count_every_end()
        for rid in ("early", "a", "b", "c", "d", "e"):
            add(rid)
        processor.process_outputs([out("early", FinishReason.LENGTH)])  # before the drain
        dd.TALLY.begin(processor.request_states)  # what AsyncLLM.shutdown does first
        processor.process_outputs(
            [out("a", FinishReason.LENGTH), out("b", FinishReason.ABORT), out("c"), out("d")]
        )
        assert df.read_result(tmp_path) == df.Result(5, 1, 1, 0, 3)
        processor.abort_requests(["c"], internal=False)
        processor.propagate_error(RuntimeError("the engine stopped first"))
        got = df.read_result(tmp_path)
        assert got == df.Result(in_flight=5, finished=1, aborted=2, failed=2, open=0)
    finally:
        dd.PATCH.revert()
    assert OutputProcessor.propagate_error.__module__.startswith("vllm.")  # reverted


def test_result_written_then_read_back_beside_the_forecast(tmp_path):
    df.write(df.Result(3, 2, 1, 0, 0), {run_files.ENV: str(tmp_path)})
    assert df.read_result(tmp_path) == df.Result(3, 2, 1, 0, 0)
    own = f"{run_files.RESULT}{os.getpid()}.json"
    assert [p.name for p in tmp_path.iterdir()] == [own]  # no temporary left
    assert df.read(tmp_path) is None  # a result is not a forecast
    # --api-server-count 2: each API server process counts its own requests; they add up
    other = dataclasses.asdict(df.Result(2, 1, 0, 0, 1))
    (tmp_path / f"{run_files.RESULT}1.json").write_text(json.dumps(other))
    assert df.read_result(tmp_path) == df.Result(5, 3, 1, 0, 1)


@pytest.mark.parametrize("kind", ["missing", "symlink", "wrong-keys", "bool", "float", "negative"])
def test_read_result_refuses_what_is_not_a_result(tmp_path, kind):
    path = tmp_path / f"{run_files.RESULT}1.json"
    good = dataclasses.asdict(df.Result(3, 2, 1, 0, 0))
    if kind == "symlink":
        (tmp_path / "real").write_text(json.dumps(good))
        path.symlink_to(tmp_path / "real")
    elif kind == "wrong-keys":
        path.write_text(json.dumps({**good, "cut": 1}))
    elif kind in ("bool", "float", "negative"):
        path.write_text(
            json.dumps({**good, "finished": {"bool": True, "float": 2.0}.get(kind, -1)})
        )
    assert df.read_result(tmp_path) is None
