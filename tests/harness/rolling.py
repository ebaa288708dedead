"""Replicas behind the HAProxy LB, under client load, restarted one by one: what a client of the
service sees. Shared by tests/container/test_rolling_restart.py and bench/rolling.py.

A `Deployment` is one compose project of compose.yaml + compose.replicas.yaml (+ the bare-vLLM
override for the alternative), driven through the project's scripts (scripts/compose.sh,
scripts/rolling-restart.sh). `Load` is the client: a few threads sending short completions and long
streams to the LB on 127.0.0.1 until stopped, bounded in count and time, recording every request.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import threading
import time
from dataclasses import asdict, dataclass

import requests

from tests.harness import ROOT, docker, free_port, stream_completion
from vllm_intel.patches.drain_deadline import RefuseWhileDraining
from vllm_intel.supervisor import timing

REPLICAS_FILE = ROOT / "compose.replicas.yaml"
BARE_FILE = ROOT / "bench" / "compose.bare-vllm.yaml"


# The client load of the test and the bench: streams of 256 tokens (~1-3 s each on 2 idle cores),
# 16-token completions, and long streams sized to last ~10 s at the rate the streams see (at most
# LONG_MAX_TOKENS): on a slow host they outlast the LB's drain step (LB_DRAIN_S), and the drain
# must finish them within DRAIN_S even when the replica starting next to it slows generation down
# several times. Each client pauses `pause_s` between two requests: with 0.5 s the load kept both
# cores busy and a restarted replica took 130-210 s to start (the imports of each of its three
# processes ~30 s), with 2 s 55-75 s on the same host; the requests sent during the restart are
# still in the hundreds.
LOAD = dict(
    streams=2,
    shorts=2,
    longs=2,
    long_s=10,
    pause_s=2,
    stream_tokens=256,
    short_tokens=16,
    max_requests=4000,
    max_seconds=900,
)
# A long stream must finish inside DRAIN_S at the slowest rate a draining replica gives it while
# the other replica carries all new load: down to ~8 tokens/s per stream on 2 busy cores
# (docs/bench.md, "rolling restart: the test", what the test caught on the way).
LONG_MAX_TOKENS = 360
# Each drain has work by construction: from the replica's DRAIN step at the LB, the harness sends it
# witnesses (streams straight to it, one every WITNESS_EVERY_S, each sized to last WITNESS_S at
# the rate the streams saw, within the model's length) until it refuses one. A draining replica
# refuses every request that arrives after its drain began (the drain's 503), and one answered 200
# arrived before, so a witness answered in full that ended after the replica's first refusal was in
# flight when its drain began, and the drain finished it: whenever the SIGTERM comes, the witnesses
# accepted in the WITNESS_S before it still stream. A witness ends inside DRAIN_S unless the
# draining replica streams it DRAIN_S / WITNESS_S times slower than the rate it was sized at.
WITNESS_S = 8
WITNESS_EVERY_S = 1
PROMPT_ROOM = 16  # of the model's length, kept for a witness's prompt
DRAIN_S = timing.DEFAULT_DRAIN_S  # the product's: what a user's rollout drains with
LB_DRAIN_S = 1  # HAProxy stops sending at once; the 5 s default stands for Kubernetes' preStop
# How long `up` waits for the replicas, which start together: also their healthchecks' start
# period, or a start slower than compose.yaml's default period makes `up --wait` fail.
UP_WAIT_S = 900


class Deployment:
    """N replicas of the CPU image behind the LB image, as one compose project."""

    def __init__(
        self,
        image: str,
        lb_image: str,
        name: str,
        *,
        bare: bool = False,
        drain: int = 30,
        lb_drain: int = 5,
        replicas: int = 2,
        lb_config: str | None = None,
        log_dir=None,
    ):
        self.name, self.bare, self.drain = name, bare, drain
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # --enforce-eager: each restart skips torch.compile (a start takes ~40 s instead of ~60 s
        # on 2 busy cores); the drain does not depend on it.
        self.env = dict(
            os.environ,
            COMPOSE_PROJECT_NAME=name,
            INTEL_VLLM_CPU_IMAGE=image,
            INTEL_VLLM_LB_IMAGE=lb_image,
            INTEL_VLLM_PORT=str(self.port),
            INTEL_VLLM_REPLICAS=str(replicas),
            INTEL_VLLM_DRAIN_TIMEOUT=str(drain),
            INTEL_VLLM_STOP_GRACE_PERIOD=f"{drain + 15}s",
            INTEL_VLLM_CPU_COMMAND="serve --enforce-eager",
            INTEL_VLLM_HEALTH_INTERVAL="2s",
            INTEL_VLLM_START_PERIOD=f"{UP_WAIT_S}s",
            LB_DRAIN_SECONDS=str(lb_drain),
        )
        if lb_config:
            self.env["INTEL_VLLM_LB_CONFIG"] = str(lb_config)
        self.log_dir = log_dir or ROOT / "build" / "rolling"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # An empty env file keeps a developer's .env out (the process env above wins anyway).
        self.env_file = self.log_dir / f"{name}.env"
        self.env_file.write_text("")
        self.options = ["--env-file", str(self.env_file)] + (["-f", str(BARE_FILE)] if bare else [])

    def compose(self, *args: str, timeout: float = 600, check: bool = True):
        return subprocess.run(
            [
                "bash",
                str(ROOT / "scripts" / "compose.sh"),
                "-f",
                str(REPLICAS_FILE),
                *self.options,
                *args,
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    def up(self) -> float:
        t = time.monotonic()
        args = ("up", "-d", "--wait", "--wait-timeout", str(UP_WAIT_S))
        r = self.compose(*args, timeout=UP_WAIT_S + 60, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"compose up failed:\n{r.stderr[-3000:]}\n{self.logs()[-4000:]}")
        return time.monotonic() - t

    def rolling_restart(self, timeout: float = 1200, on_line=None) -> tuple[int, str, float]:
        """scripts/rolling-restart.sh on this project: (exit code, its output, seconds); each
        line of its output goes to `on_line` as it is printed."""
        t = time.monotonic()
        p = subprocess.Popen(
            ["bash", str(ROOT / "scripts" / "rolling-restart.sh"), *self.options],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        timer = threading.Timer(timeout, p.kill)
        timer.start()
        lines = []
        try:
            for line in p.stdout:
                lines.append(line)
                if on_line is not None:
                    on_line(line)
            code = p.wait()
        finally:
            timer.cancel()
        return code, "".join(lines), time.monotonic() - t

    def replica_urls(self) -> dict[str, str]:
        """Each replica's container name -> its own URL on the compose network (no LB between);
        the host reaches a container's bridge address. Read before a restart renews them."""
        ids = self.compose("ps", "-q", "vllm-cpu").stdout.split()
        if not ids:  # none running (e.g. every replica crashed): no witness to send
            return {}
        out = docker(
            "inspect",
            "-f",
            "{{.Name}} {{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
            *ids,
            timeout=60,
        ).stdout
        return {
            name.lstrip("/"): f"http://{ip}:8000"
            for name, ip, *_ in (line.split() for line in out.splitlines() if line.strip())
        }

    def model(self) -> tuple[str, int]:
        """The served model's name and length (prompt + answer tokens)."""
        card = requests.get(self.url + "/v1/models", timeout=10).json()["data"][0]
        return card["id"], card["max_model_len"]

    def logs(self, *services: str) -> str:
        return self.compose("logs", "--no-color", *services, check=False, timeout=120).stdout

    def down(self) -> None:
        (self.log_dir / f"{self.name}.log").write_text(self.logs())
        self.compose("down", "-v", "--timeout", str(self.drain + 15), check=False, timeout=300)
        self.env_file.unlink(missing_ok=True)


@dataclass
class Request:
    kind: str  # "stream", "long", "short", "witness" or "refused" (a witness the drain refused)
    start: float  # monotonic
    end: float
    ok: bool  # a complete answer: every token, and `[DONE]` for a stream
    detail: str = ""  # why not, when not ok
    tokens: int = 0  # asked for
    replica: str = ""  # a witness's replica

    @property
    def latency(self) -> float:
        return self.end - self.start


class Load:
    """`streams` threads of streams, `shorts` threads of short completions and `longs` threads of
    long streams, each sending one request after the other to the LB until stop() or
    `max_requests` / `max_seconds`. A long stream is sized to last about `long_s` seconds at the
    token rate the last streams saw: long enough to outlast the LB's drain step before SIGTERM (so
    the replica's own drain has work), short enough to finish within the drain, on an idle or a
    loaded host alike."""

    def __init__(
        self,
        url: str,
        model: str,
        *,
        streams: int = 2,
        shorts: int = 2,
        stream_tokens: int = 300,
        short_tokens: int = 16,
        longs: int = 0,
        long_s: float = 15,
        pause_s: float = 0,
        max_requests: int = 5000,
        max_seconds: float = 900,
        timeout: float = 120,
    ):
        self.url, self.model, self.timeout = url, model, timeout
        self.stream_tokens, self.short_tokens = stream_tokens, short_tokens
        self.long_s, self.pause_s = long_s, pause_s
        self.rates: list[float] = []  # tokens/s of the last successful streams
        self.max_requests, self.deadline = max_requests, time.monotonic() + max_seconds
        self.done: list[Request] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.started = time.monotonic()
        self.threads = [
            threading.Thread(target=self._loop, args=(kind,), daemon=True)
            for kind in ["stream"] * streams + ["short"] * shorts + ["long"] * longs
        ]
        for t in self.threads:
            t.start()

    def _loop(self, kind: str) -> None:
        while not self.stopping.is_set() and time.monotonic() < self.deadline:
            with self.lock:
                if len(self.done) >= self.max_requests:
                    return
            r = self._short() if kind == "short" else self._stream(kind)
            with self.lock:
                self.done.append(r)
            self.stopping.wait(self.pause_s)

    def witness(self, name: str, url: str, until: threading.Event, max_tokens: int) -> None:
        """Witnesses for replica `name` at `url`: a stream straight to it every WITNESS_EVERY_S,
        each sized to last WITNESS_S (at most `max_tokens`), until it refuses one or `until`;
        recorded as kind "witness", or "refused" (stop() waits for them)."""

        def one() -> None:
            r = self._stream("witness", url, self._tokens(WITNESS_S, cap=max_tokens))
            r.replica = name
            if r.kind == "refused":
                until.set()
            with self.lock:
                self.done.append(r)

        def send() -> None:
            while not (until.is_set() or self.stopping.is_set()):
                t = threading.Thread(target=one, daemon=True)
                t.start()
                with self.lock:
                    self.threads.append(t)
                until.wait(WITNESS_EVERY_S)

        t = threading.Thread(target=send, daemon=True)
        t.start()
        with self.lock:
            self.threads.append(t)

    def _stream(self, kind: str, url: str | None = None, tokens: int | None = None) -> Request:
        start = time.monotonic()
        if tokens is None:
            tokens = self._tokens(self.long_s) if kind == "long" else self.stream_tokens
        res = stream_completion(url or self.url, self.model, tokens, timeout=self.timeout)
        if kind == "witness" and refused(res):
            return Request("refused", start, res.ended, True, f"status {res.status}: {res.error}")
        ok = (
            res.status == 200
            and res.done
            and not res.error
            and res.finish_reason == "length"
            and res.tokens == tokens
        )
        detail = (
            ""
            if ok
            else (
                f"status {res.status}, [DONE] {res.done}, finish {res.finish_reason}, "
                f"tokens {res.tokens}/{tokens}, error {res.error}"
            )
        )
        if ok and kind != "witness":
            with self.lock:
                self.rates = [*self.rates[-5:], tokens / max(res.ended - start, 0.01)]
        return Request(kind, start, res.ended, ok, detail, tokens)

    def _tokens(self, seconds: float, cap: int | None = LONG_MAX_TOKENS) -> int:
        """Tokens for a stream of about `seconds` at the median rate of the last streams."""
        with self.lock:
            rate = statistics.median(self.rates) if self.rates else None
        if rate is None:
            return self.stream_tokens
        tokens = int(rate * seconds) if cap is None else min(int(rate * seconds), cap)
        return max(self.stream_tokens, tokens)

    def _short(self) -> Request:
        start = time.monotonic()
        body = {
            "model": self.model,
            "prompt": "def main(",
            "max_tokens": self.short_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
        }
        try:
            r = requests.post(self.url + "/v1/completions", json=body, timeout=self.timeout)
            if r.status_code != 200:
                return Request(
                    "short",
                    start,
                    time.monotonic(),
                    False,
                    f"status {r.status_code}: {r.text[:200]}",
                )
            got = r.json()
            tokens = got["usage"]["completion_tokens"]
            ok = tokens == self.short_tokens and got["choices"][0]["finish_reason"] == "length"
            return Request(
                "short", start, time.monotonic(), ok, "" if ok else f"tokens {tokens}: {got}"[:300]
            )
        except (requests.RequestException, ValueError, KeyError) as e:
            return Request(
                "short", start, time.monotonic(), False, f"{type(e).__name__}: {e}"[:300]
            )

    def stop(self, timeout: float = 180) -> list[Request]:
        """Stop sending; wait for the requests in flight. One still running after `timeout` is a
        hang and is returned as a failed request."""
        self.stopping.set()
        end = time.monotonic() + timeout
        # Twice: a witness sender (ending at once) may have added a stream during the first pass.
        for _ in range(2):
            for t in list(self.threads):
                t.join(max(end - time.monotonic(), 0))
        hung = [
            Request(
                "hung",
                self.started,
                time.monotonic(),
                False,
                f"a client thread still waits {timeout:.0f} s after the load stopped",
            )
            for t in self.threads
            if t.is_alive()
        ]
        with self.lock:
            return list(self.done) + hung


def refused(res) -> bool:
    """A replica did not take the request: its drain's 503, or no server listening (bare vLLM
    stopping); nothing was lost, a client behind the LB gets it replayed."""
    drain_503 = res.status == 503 and res.error == RefuseWhileDraining.BODY.decode()
    return drain_503 or "Connection refused" in (res.error or "")


def at_drain(reqs: list[Request], name: str) -> list[float]:
    """The witnesses of replica `name` in flight when its drain began and finished in full:
    answered 200 (arrived before the drain) and ended after its first refusal (received after it
    began); for each, the seconds it ended after that refusal."""
    first = min((r.end for r in reqs if r.kind == "refused" and r.replica == name), default=None)
    if first is None:
        return []
    return [
        round(r.end - first, 1)
        for r in reqs
        if r.kind == "witness" and r.ok and r.replica == name and r.end > first
    ]


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def latencies(reqs: list[Request], kind: str, lo: float, hi: float) -> dict:
    """p50 / p99 (s) of the successful `kind` requests that started in [lo, hi)."""
    xs = sorted(r.latency for r in reqs if r.kind == kind and r.ok and lo <= r.start < hi)
    return {"n": len(xs), "p50": pct(xs, 50), "p99": pct(xs, 99)}


def rollout(dep: Deployment, *, warm_s: float = 15, after_s: float = 5, **load_kw) -> dict:
    """Client load on the running deployment for `warm_s` (steady state), a full rolling restart
    during it, `after_s` more, then the counts and latencies of everything the clients sent."""
    model, max_len = dep.model()
    # Warm-up: the first requests on a fresh replica are slow (~20 s on 2 busy cores); the steady
    # window must measure a warm service, as the restart window does.
    warm = Load(
        dep.url,
        model,
        **dict(load_kw, shorts=2, streams=4, longs=0, stream_tokens=64, max_requests=12),
    )
    time.sleep(5)
    warm.stop(timeout=120)
    load = Load(dep.url, model, **load_kw)
    replicas = dep.replica_urls()
    time.sleep(warm_s)

    exited = {name: threading.Event() for name in replicas}
    order: list[str] = []  # the replicas in the order of their DRAIN step

    def on_line(line: str) -> None:
        # A replica's witnesses run from its DRAIN step until it refuses one, at the latest until
        # it exited (the script's "stopped in" line).
        step = re.search(r"\] (\S+): (others ready .* set to DRAIN|stopped in)", line)
        if step and step[1] in replicas:
            if step[2] == "stopped in":
                exited[step[1]].set()
            else:
                order.append(step[1])
                load.witness(step[1], replicas[step[1]], exited[step[1]], max_len - PROMPT_ROOM)

    t0 = time.monotonic()
    code, output, took = dep.rolling_restart(on_line=on_line)
    t1 = time.monotonic()
    time.sleep(after_s)
    reqs = load.stop()
    failed = [r for r in reqs if not r.ok]
    replica_logs = dep.logs("vllm-cpu")
    lb_logs = dep.logs("lb")
    # The supervisor's exit line: how many requests each stopped replica was running at SIGTERM
    # (observe.Observer.summary: "; N in flight at SIGTERM, ...").
    in_flight = [int(n) for n in re.findall(r"; (\d+) in flight at SIGTERM", replica_logs)]
    # HAProxy's httplog: .../srv_conn/retries, "+N" when redispatched to another server.
    replayed = len(re.findall(r" \d+/\d+/\d+/\d+/\+?[1-9]\d* \d+/\d+ \"", lb_logs))
    return {
        "bare": dep.bare,
        "restart_exit": code,
        "restart_s": round(took, 1),
        "restart_output": output,
        "total": len(reqs),
        "failed": len(failed),
        "streams": sum(r.kind == "stream" for r in reqs),
        "shorts": sum(r.kind == "short" for r in reqs),
        "failed_streams": sum(r.kind == "stream" for r in failed),
        "failed_shorts": sum(r.kind == "short" for r in failed),
        "longs": sum(r.kind == "long" for r in reqs),
        "failed_longs": sum(r.kind == "long" for r in failed),
        "long_tokens": sorted({r.tokens for r in reqs if r.kind == "long"}),
        "long_seconds": [round(r.latency, 1) for r in reqs if r.kind == "long" and r.ok],
        "witnesses": sum(r.kind == "witness" for r in reqs),
        "witness_seconds": [round(r.latency, 1) for r in reqs if r.kind == "witness"],
        "refused": sum(r.kind == "refused" for r in reqs),
        "witnesses_at_drain": [at_drain(reqs, name) for name in order],
        "hung": sum(r.kind == "hung" for r in reqs),
        "failures": [asdict(r) | {"at_s": round(r.start - t0, 1)} for r in failed][:20],
        "during_restart": sum(t0 <= r.start < t1 for r in reqs),
        "in_flight_at_sigterm": in_flight,
        "lb_replayed": replayed,
        "latency": {
            kind: {
                "steady": latencies(reqs, kind, load.started, t0),
                "restart": latencies(reqs, kind, t0, t1),
            }
            for kind in ("short", "stream", "long")
        },
    }


def summary(result: dict) -> str:
    lat = result["latency"]
    f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    lines = [
        f"{'bare vllm serve' if result['bare'] else 'entrypoint.py'}: "
        f"{result['failed']} failed / {result['total']} requests "
        f"({result['failed_streams']}/{result['streams']} streams, "
        f"{result['failed_shorts']}/{result['shorts']} short, "
        f"{result['failed_longs']}/{result['longs']} long, {result['hung']} hung); "
        f"{result['during_restart']} sent during the {result['restart_s']} s rolling restart "
        f"(exit {result['restart_exit']}); in flight at each SIGTERM {result['in_flight_at_sigterm']}; "
        f"replayed by the LB {result['lb_replayed']}; witnesses {result['witnesses']} "
        f"(s: {result['witness_seconds']}), refused by the drains {result['refused']}; in flight "
        f"as each drain began {[len(w) for w in result['witnesses_at_drain']]} (ending s after "
        f"the drain's first refusal: {result['witnesses_at_drain']})"
    ]
    for kind in ("short", "stream", "long"):
        s, r = lat[kind]["steady"], lat[kind]["restart"]
        lines.append(
            f"  {kind} latency p50/p99 s: steady {f(s['p50'])}/{f(s['p99'])} (n {s['n']}), "
            f"during restart {f(r['p50'])}/{f(r['p99'])} (n {r['n']})"
        )
    for fl in result["failures"][:5]:
        lines.append(f"  failed {fl['kind']} at {fl['at_s']} s: {fl['detail'][:200]}")
    return "\n".join(lines)


def save(result: dict, path) -> None:
    path.write_text(json.dumps(result, indent=2, default=str))
