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
written as JSON to ``$INTEL_VLLM_DRAIN_FORECAST`` (the supervisor sets it inside its run
directory) for the supervisor's exit line.

A request that got no token between the samples (still waiting) is given the median speed of the
others; with none known (vLLM run with ``--disable-log-stats`` counts no tokens) the time needed is
unknown and said so, never guessed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import statistics

FORECAST_ENV = "INTEL_VLLM_DRAIN_FORECAST"
MAX_FORECAST_BYTES = 4096  # what the supervisor reads of it
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


def write(found: Forecast, env=os.environ) -> None:
    """To $INTEL_VLLM_DRAIN_FORECAST when set (best effort: a forecast never stops a drain)."""
    path = env.get(FORECAST_ENV)
    if not path:
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(dataclasses.asdict(found), f)
    except OSError:
        pass


def read(path: str) -> Forecast | None:
    """The forecast the API server wrote, or None (absent, too big, or not a forecast)."""
    try:
        # Never a FIFO or a symlink: the supervisor must not block or be sent elsewhere.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            raw = f.read(MAX_FORECAST_BYTES + 1)
        if len(raw) > MAX_FORECAST_BYTES:
            return None
        data = json.loads(raw)
        if not isinstance(data, dict) or set(data) != {
            f.name for f in dataclasses.fields(Forecast)
        }:
            return None
        found = Forecast(**data)
        numbers = (found.in_flight, found.cut, found.unknown, found.window_s, found.cut_at_s)
        if not all(isinstance(n, int | float) and not isinstance(n, bool) for n in numbers):
            return None
        return found
    except (OSError, ValueError, TypeError):
        return None
