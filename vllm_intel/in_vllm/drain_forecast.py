"""The drain forecast: at the start of a drain, what the requests in flight still need.

Read in the API server process from vLLM's own per-request state (``OutputProcessor.
request_states``: tokens generated so far and ``max_tokens``), by drain-deadline's
``AsyncLLM.shutdown`` wrapper, twice: when the drain starts and ``SAMPLE_S`` later, while the
drain runs (no new request joins it). A request's speed is the tokens it got between the two: the
speed of the drain itself, not of the busier time before it (streams that had just started, a
host still admitting requests: slower than the drain, docs/bench.md, "Measured outside `make
bench`", "`drain-deadline`"). The tokens are divided by the time between the engine's stamps of
the first and the last of them (``last_token_ts``), not by the time between the samples: a second
holds a handful of tokens of a large model on a CPU (8-12), so counting them against the clock
would be off by up to one token in eight. The forecast is logged, and
written as JSON into the supervisor's run directory (``vllm_intel.in_vllm.run_files``) for the
supervisor's exit line.

A request that got no token between the samples (still waiting) is given the median speed of the
others; with none known (vLLM run with ``--disable-log-stats`` counts no tokens) the time needed is
unknown and said so, never guessed.

How the drain ended is counted there too, not sampled: from the drain's start, drain-deadline's
hooks of vLLM's ``OutputProcessor`` hand each request's final event (``Tally``) as it happens, and
the counts (``Result``) are rewritten beside the forecast at each one, one file per API server
process (``--api-server-count``; the supervisor adds them up), so the files hold every end before
vLLM's API servers exit.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import statistics
import threading
from collections import Counter

from . import run_files
from .run_files import Result

SAMPLE_S = 1.0  # between the two samples (at most; less in a short window)


@dataclasses.dataclass(frozen=True)
class InFlight:
    generated: int  # tokens sent so far
    max_tokens: int | None  # None: unbounded (to the model's length)
    rate: float | None  # tokens/s between the samples; None: not known


@dataclasses.dataclass(frozen=True)
class Forecast:
    in_flight: int
    window_s: float  # the drain window (vLLM's --shutdown-timeout)
    cut_at_s: float  # when drain-deadline aborts what is unfinished, from the drain's start
    tokens_left: int | None  # None: a request has no max_tokens
    rate: float | None  # median tokens/s per request
    need_s: float | None  # from the drain's start until the slowest finishes; None: unknown
    cut: int  # requests that will not finish by cut_at_s at their speed
    unknown: int  # requests whose time could not be estimated

    def line(self) -> str:
        if not self.in_flight:
            return "drain forecast: nothing in flight"
        out = f"drain forecast: {self.in_flight} request(s) in flight"
        if self.tokens_left is not None:
            out += f", {self.tokens_left} token(s) to go"
        if self.rate is not None:
            out += f" at {self.rate:.1f} tokens/s each (median)"
        if self.need_s is None:
            return out + f"; time needed unknown (no token rate), window {self.window_s:.0f} s"
        slowest = "the slowest known" if self.unknown else "the slowest"
        out += f"; {slowest} needs {self.need_s:.0f} s of the {self.window_s:.0f} s window"
        if self.cut:
            return out + f": {self.cut} will be cut at {self.cut_at_s:.0f} s"
        return out + ": all finish" + (f" ({self.unknown} unknown)" if self.unknown else "")

    def brief(self) -> str:
        """The supervisor's exit-line words for it."""
        if not self.in_flight:
            return "nothing in flight"
        need = "time unknown" if self.need_s is None else f"the slowest needing {self.need_s:.0f} s"
        return (
            f"{self.in_flight} in flight, {need} of the {self.window_s:.0f} s window, "
            f"{self.cut} to be cut"
        )


# request id -> (generated, max_tokens, the engine's stamp of the last token: its monotonic clock)
Sample = dict[str, tuple[int | None, int | None, float | None]]


def sample(states: dict) -> Sample:
    """Tokens so far, max_tokens and the last token's stamp of each of vLLM's ``RequestState``
    objects (generated and stamp are None where vLLM keeps no stats)."""
    out = {}
    for rid, st in list(states.items()):  # list(): one step under the GIL, the loop mutates it
        stats = getattr(st, "stats", None)
        generated = None if stats is None else int(stats.num_generation_tokens)
        stamp = getattr(stats, "last_token_ts", None) or None  # 0.0: no token yet
        max_tokens = getattr(st, "max_tokens_param", None)
        out[rid] = (generated, int(max_tokens) if max_tokens else None, stamp)
    return out


def in_flight(before: Sample, after: Sample, elapsed: float) -> list[InFlight]:
    """The requests of `before` (the drain's start), with their speed from `before` to `after`
    (`elapsed` seconds later): the tokens between over the time between their stamps, or over
    `elapsed` where there is no stamp; one gone from `after` has finished (nothing left)."""
    out = []
    for rid, (generated, max_tokens, stamp) in before.items():
        if rid not in after:
            done = max_tokens if max_tokens is not None else generated or 0
            out.append(InFlight(done, done, None))
            continue
        now, _, now_stamp = after[rid]
        rate = None
        if generated is not None and now is not None and now > generated:
            span = now_stamp - stamp if stamp and now_stamp and now_stamp > stamp else elapsed
            rate = (now - generated) / span if span > 0 else None
        out.append(InFlight(now or 0, max_tokens, rate))
    return out


def forecast(
    requests: list[InFlight], window_s: float, cut_at_s: float, elapsed: float = 0.0
) -> Forecast:
    """`elapsed`: seconds from the drain's start to the speeds' measurement."""
    rates = [r.rate for r in requests if r.rate]
    median = statistics.median(rates) if rates else None
    need, cut, unknown, left = [], 0, 0, 0
    for r in requests:
        rest = None if r.max_tokens is None else max(r.max_tokens - r.generated, 0)
        left = None if rest is None or left is None else left + rest
        rate = r.rate or median
        if rest == 0:
            seconds = elapsed
        elif rest is None or not rate:
            unknown += 1
            continue
        else:
            seconds = elapsed + rest / rate
        need.append(seconds)
        cut += seconds > cut_at_s
    return Forecast(
        in_flight=len(requests),
        window_s=window_s,
        cut_at_s=cut_at_s,
        tokens_left=left,
        rate=median,
        need_s=max(need) if need else None,
        cut=cut,
        unknown=unknown,
    )


class Tally:
    """The final event of each request from the drain's start on, by request id; the first one
    counts (an error raised into a request may follow the end it already had). Ends arrive on the
    API server's event loop, the start on its shutdown's executor thread: each call writes the
    counts under the lock, so this process's file always holds its last end."""

    HOW = ("finished", "aborted", "failed")

    def __init__(self, env=os.environ):
        self.env = env
        self._lock = threading.Lock()
        self.start: frozenset[str] | None = None  # open at the drain's start; None: not yet
        self.ends: dict[str, str] = {}  # request id -> one of HOW

    @property
    def counting(self) -> bool:
        return self.start is not None

    def begin(self, open_ids) -> None:
        """The drain starts with the requests `open_ids` (vLLM's ``request_states``)."""
        with self._lock:
            if self.start is None:
                self.start = frozenset(list(open_ids))  # list(): one step under the GIL
                write(self.result(self.start), self.env)

    def end(self, ids, how: str, open_ids) -> None:
        """Requests `ids` ended `how`; `open_ids`: the requests vLLM still holds."""
        with self._lock:
            if self.start is None:
                return
            for rid in ids:
                self.ends.setdefault(rid, how)
            write(self.result(list(open_ids)), self.env)

    def result(self, open_ids) -> Result:
        still = set(open_ids) - self.ends.keys()
        counts = Counter(self.ends.values())
        return Result(
            len(self.start | self.ends.keys() | still), *(counts[h] for h in self.HOW), len(still)
        )


def write(found: Forecast | Result, env=os.environ) -> None:
    """Into the run directory `env` names, if any: the forecast, or this process's counts (a
    Result). Best effort: a forecast never stops a drain."""
    mine = f"{run_files.RESULT}{os.getpid()}.json" if isinstance(found, Result) else None
    where = run_files.path(mine or run_files.FORECAST, env)
    if where:
        run_files.write(where, dataclasses.asdict(found))


def load(data, kind: type) -> dict | None:
    """`data` (what run_files.read gave) if it holds exactly the fields of a `kind` (Forecast,
    Result), else None."""
    fields = {f.name for f in dataclasses.fields(kind)}
    return data if isinstance(data, dict) and set(data) == fields else None


def number(n, kind=int | float) -> bool:
    return isinstance(n, kind) and not isinstance(n, bool)


def read(run_dir: pathlib.Path) -> Forecast | None:
    """The forecast the API server wrote in `run_dir`, or None (absent, too big, or not one)."""
    data = load(run_files.read(run_dir / run_files.FORECAST), Forecast)
    if data is None:
        return None
    found = Forecast(**data)
    numbers = (found.in_flight, found.cut, found.unknown, found.window_s, found.cut_at_s)
    return found if all(number(n) for n in numbers) else None


def read_result(run_dir: pathlib.Path) -> Result | None:
    """The counts the API server processes wrote in `run_dir`, added up; None if none wrote any."""
    found = [load(data, Result) for data in run_files.read_all(run_dir, run_files.RESULT)]
    found = [d for d in found if d and all(number(n, int) and n >= 0 for n in d.values())]
    if not found:
        return None
    return Result(**{k: sum(d[k] for d in found) for k in found[0]})
