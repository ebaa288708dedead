"""What the tests and bench/ share: the repository root, servers, stream clients, polling,
process trees and their shared memory.

Only the standard library, `requests`, psutil and vllm_intel (all in every test venv).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass

import psutil
import requests

from vllm_intel.patches.shm_busy_sleep import WAKE_PREFIX
from vllm_intel.supervisor import janitor

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_VLLM = (ROOT / "VLLM_VERSION").read_text().strip()
OLD_VLLM = "0.27.1"  # the oldest release we test that still lacks the CPU no-op fix
# The CPU image's compose lifecycle on OLD_VLLM repeats DEFAULT_VLLM's on another release; every
# run shows the patches' states on OLD_VLLM in real `vllm serve` processes
# (tests/patches/test_serve.py). It runs with INTEL_VLLM_CPU_RELEASES=all, as Buildkite's
# scheduled builds do (.buildkite/steps/cpu.sh).
ALL_CPU_RELEASES = os.environ.get("INTEL_VLLM_CPU_RELEASES") == "all"
# A negative control (a patch left out, to show the bug it fixes and so that its test can fail)
# repeats what the same release showed before; a new release in VLLM_VERSION reruns it by hand or
# in the next scheduled build. It runs with INTEL_VLLM_CONTROLS=all, as Buildkite's scheduled
# builds do (.buildkite/steps/cpu.sh).
ALL_CONTROLS = os.environ.get("INTEL_VLLM_CONTROLS") == "all"


def control(value, id_: str | None = None):
    """A parametrize value for a negative-control arm (its id: `id_`, else the value), run with
    INTEL_VLLM_CONTROLS=all."""
    id_ = id_ or str(value)
    import pytest  # here: the benchmarks use this module without pytest

    why = f"negative control {id_}: INTEL_VLLM_CONTROLS=all (scheduled builds)"
    return pytest.param(value, id=id_, marks=pytest.mark.skipif(not ALL_CONTROLS, reason=why))


# What every local vllm serve of the tiny model needs on these CPU-only, offline machines.
SERVE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def build_image(kind: str, version: str = DEFAULT_VLLM, target: str = "runtime"):
    """`scripts/build-image.sh KIND` (the one build command) -> (CompletedProcess, seconds)."""
    env = dict(os.environ, VLLM_VERSION=version, TARGET=target)
    t0 = time.monotonic()
    script = str(ROOT / "scripts" / "build-image.sh")
    out = subprocess.run(
        ["bash", script, kind], env=env, capture_output=True, text=True, timeout=2400
    )
    return out, time.monotonic() - t0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The supervisor's exit line words for the forecast drain-deadline wrote at SIGTERM
# (vllm_intel.in_vllm.drain_forecast.Forecast.brief).
EXIT_FORECAST = re.compile(
    r"forecast at SIGTERM: (?P<in_flight>\d+) in flight, the slowest needing (?P<need>\d+) s of "
    r"the (?P<window>\d+) s window, (?P<cut>\d+) to be cut"
)

DOCKER = os.environ.get("DOCKER", "/usr/bin/docker")  # the Debian CLI builds with BuildKit


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [DOCKER, *args], capture_output=True, text=True, timeout=timeout, check=check
    )


def patch_line(logs: str, process: str) -> str:
    """The plugin's status line of one vLLM process (`EngineCore`, `Worker`) in a server's logs."""
    return next(x for x in logs.splitlines() if f"{process}): cpu-accelerator-api" in x)


def wake_words(container: str) -> list[str]:
    """Patch shm-busy-sleep's futex words in a running container's /dev/shm."""
    shm = docker("exec", container, "ls", "/dev/shm").stdout.split()
    return [f for f in shm if f.startswith(WAKE_PREFIX)]


class Container:
    """`docker run -d` of an image serving on its port 8000, published on a free loopback port;
    ready once /health answers 200. A context manager: removed on exit."""

    def __init__(self, name: str, image: str, run_args=(), cmd=()):
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        docker("run", "-d", "--name", name, "-p", f"127.0.0.1:{self.port}:8000", *run_args,
               image, *cmd)  # fmt: skip

    def wait_ready(self, timeout: float) -> float:
        """Seconds until /health answered; RuntimeError (with the log's tail) if it exited."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return time.monotonic() - t0
            except requests.RequestException:
                pass
            if docker("inspect", "-f", "{{.State.Running}}", self.name).stdout.strip() != "true":
                raise RuntimeError(f"{self.name} exited:\n{self.logs()[-4000:]}")
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} not ready after {timeout:.0f} s:\n{self.logs()[-4000:]}")

    def logs(self) -> str:
        """The entrypoint's lines (stderr) and vLLM's logger (stdout), stderr last."""
        out = docker("logs", self.name, check=False)
        return out.stdout + out.stderr

    def remove(self, keep_log: pathlib.Path | None = None) -> None:
        if keep_log is not None:
            keep_log.parent.mkdir(parents=True, exist_ok=True)
            keep_log.write_text(self.logs())
        docker("rm", "-f", self.name, check=False, timeout=120)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


class Server:
    """A server process in its own session, its output in a log file."""

    def __init__(self, argv: list[str], port: int, log_path: pathlib.Path, env: dict | None = None):
        self.port, self.log_path = port, log_path
        self.env = dict(os.environ, **SERVE_ENV, **(env or {}))
        self.log = open(log_path, "w")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            argv, env=self.env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.pid = self.proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 240) -> float:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return time.monotonic() - self.started
            except requests.RequestException:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.tail()}")

    def model_name(self) -> str:
        return requests.get(self.url + "/v1/models", timeout=5).json()["data"][0]["id"]

    def signal(self, sig: int = signal.SIGTERM) -> float:
        os.kill(self.pid, sig)
        return time.monotonic()

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill_all(self) -> None:
        """SIGKILL the server and everything under it (vLLM runs in a session of its own)."""
        for pid in [self.pid] + descendants(self.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self.log.close()

    def tail(self, lines: int = 40) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def text(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")


@dataclass
class StreamResult:
    tokens: int = 0  # completion tokens: the server's usage count when it sent one
    finish_reason: str | None = None
    done: bool = False  # saw `data: [DONE]`
    error: str | None = None  # an error event in the stream, or the HTTP/connection error
    status: int | None = None
    ended: float = 0.0  # monotonic time the stream ended

    @property
    def terminal(self) -> bool:
        """The client was told how the request ended (never a silent stall)."""
        return self.done or self.status not in (None, 200) or bool(self.error)


def stream_completion(
    url: str,
    model: str,
    max_tokens: int,
    timeout: float = 120,
    prompt: str = "def main(",
    first_token: threading.Event | None = None,
) -> StreamResult:
    res = StreamResult()
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0.0,
        "stream_options": {"include_usage": True},
    }
    try:
        with requests.post(url + "/v1/completions", json=body, stream=True, timeout=timeout) as r:
            res.status = r.status_code
            if r.status_code != 200:
                res.error = r.text[:300]
                return res
            for raw in r.iter_lines():
                if not raw.startswith(b"data: "):
                    continue
                data = raw[6:]
                if data == b"[DONE]":
                    res.done = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    res.error = json.dumps(event["error"])[:300]
                    continue
                if event.get("usage"):
                    res.tokens = event["usage"]["completion_tokens"]
                if event.get("choices"):
                    if first_token is not None:
                        first_token.set()
                    res.finish_reason = (
                        event["choices"][0].get("finish_reason") or res.finish_reason
                    )
    except requests.RequestException as e:
        res.error = f"{type(e).__name__}: {e}"[:300]
    finally:
        res.ended = time.monotonic()
    return res


class Streams:
    """N concurrent streaming completions in threads."""

    def __init__(self, url: str, model: str, n: int, max_tokens: int, timeout: float = 120):
        self.results: list[StreamResult | None] = [None] * n
        self.started = [threading.Event() for _ in range(n)]  # each stream's first token
        self.threads = [
            threading.Thread(target=self._one, args=(i, url, model, max_tokens, timeout))
            for i in range(n)
        ]
        for t in self.threads:
            t.start()

    def _one(self, i, url, model, max_tokens, timeout):
        self.results[i] = stream_completion(
            url, model, max_tokens, timeout, first_token=self.started[i]
        )

    def wait_started(self, timeout: float) -> bool:
        """True once every stream has produced a token (so a signal lands mid-generation)."""
        end = time.monotonic() + timeout
        return all(e.wait(max(end - time.monotonic(), 0)) for e in self.started)

    def wait_flowing(self, timeout: float) -> None:
        """Block until every stream has produced a token, as its client saw it; else raise with
        what each stream got. (vLLM's running gauge, sampled, can miss short-lived states.)"""
        if not self.wait_started(timeout):
            waiting = [i for i, e in enumerate(self.started) if not e.is_set()]
            raise TimeoutError(
                f"streams {waiting} produced no token within {timeout} s: "
                f"{[self.results[i] for i in waiting]}"
            )

    def wait_running(self, url: str, timeout: float) -> None:
        """Block until every stream has produced a token and vLLM's /metrics counts them all
        running: the server's view, which is what a signal must land in. The client's alone is
        not enough: a client thread starved of the GIL, or of a server that sends late, can see
        its first token when the server has already generated the whole stream."""
        from vllm_intel.supervisor.observe import request_counts

        self.wait_flowing(timeout)
        end, seen = time.monotonic() + timeout, None
        while time.monotonic() < end:
            seen = request_counts(url)
            if seen is not None and seen["running"] >= len(self.threads):
                return
            time.sleep(0.05)
        raise TimeoutError(f"vLLM never counted {len(self.threads)} streams running: {seen}")

    def join(self, timeout: float = 180) -> list[StreamResult]:
        end = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(end - time.monotonic(), 0))
        return [
            r if r is not None else StreamResult(error="client thread still waiting")
            for r in self.results
        ]


class Senders:
    """`n` clients each sending short non-streaming completions back to back until the server
    refuses one (503, the drain) or the connection is refused (the server is gone): requests sent
    through the instant of SIGTERM. `results`: (status, completion tokens or error text)."""

    def __init__(self, url: str, model: str, n: int = 2, max_tokens: int = 8):
        self.results: list[tuple[int, object]] = []
        self._lock = threading.Lock()
        body = {
            "model": model,
            # A prompt long enough that tokenizing it takes a while: the request spends time
            # between the HTTP layer and the engine, where the SIGTERM race lives.
            "prompt": "def main(): " * 1200,
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
        self.threads = [
            threading.Thread(target=self._loop, args=(url, body), daemon=True) for _ in range(n)
        ]
        for t in self.threads:
            t.start()

    def _loop(self, url: str, body: dict) -> None:
        while True:
            try:
                r = requests.post(url + "/v1/completions", json=body, timeout=60)
            except requests.ConnectionError as e:
                if "refused" in str(e).lower():
                    return
                result = (0, f"{type(e).__name__}: {e}"[:300])
            except requests.RequestException as e:
                result = (0, f"{type(e).__name__}: {e}"[:300])
            else:
                try:
                    got = r.json()
                    ok = r.status_code == 200 and got["choices"][0]["finish_reason"] == "length"
                    result = (
                        r.status_code,
                        got["usage"]["completion_tokens"] if ok else r.text[:300],
                    )
                except (ValueError, KeyError, IndexError):
                    result = (r.status_code, r.text[:300])
            with self._lock:
                self.results.append(result)
            if result[0] != 200:
                return

    def join(self, timeout: float = 120) -> list[tuple[int, object]]:
        end = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(end - time.monotonic(), 0))
        assert not any(t.is_alive() for t in self.threads), "a sender still waits"
        return self.results


def poll(check, timeout: float, what: str = "condition not reached", interval: float = 0.2):
    """check()'s first truthy value within `timeout` s; request errors count as "not yet"."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            value = check()
            if value:
                return value
        except (requests.RequestException, OSError, ValueError):
            pass
        time.sleep(interval)
    raise TimeoutError(f"{what} after {timeout} s")


def _living(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def descendants(pid: int) -> list[int]:
    """pid's live descendants (vLLM's API server, engine core, workers, resource tracker)."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True) if _living(p)]
    except psutil.Error:
        return []


def alive(pids: list[int]) -> list[int]:
    """The pids that still exist and are not zombies."""
    out = []
    for pid in pids:
        try:
            if _living(psutil.Process(pid)):
                out.append(pid)
        except psutil.Error:
            pass
    return out


def shm_segments(pids: list[int]) -> set[str]:
    """/dev/shm files the given processes map or have open (what a server must clean up), by inode
    as the janitor decides it (a live semaphore is mapped under a deleted temporary name)."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            pass
    used = janitor.files_in_use(procs)
    shm = pathlib.Path("/dev/shm")
    return {str(p) for p in shm.iterdir() if janitor.inode(p) in used}


# A warning line: vLLM's logger, Python's warnings module, Intel OpenMP's and glibc's messages.
WARNING_LINE = re.compile(r"\bWARNING\b|\w+Warning: |OMP: (Warning|Error)|\bwarning: ", re.I)


def threads_of(pid: int) -> list[str]:
    """The names of process `pid`'s threads."""
    tasks = pathlib.Path(f"/proc/{pid}/task")
    return sorted((t / "comm").read_text().strip() for t in tasks.iterdir())


def undocumented_warnings(logs: str, also: tuple[str, ...] = ()) -> list[str]:
    """The warning lines of `logs` that docs/docker.md's start-up warnings table (the list users
    read) does not name, nor `also`."""
    text = (ROOT / "docs" / "docker.md").read_text()
    block = text.split("<!-- start-up warnings:")[1].split("<!-- end: start-up warnings -->")[0]
    known = re.findall(r"^\| `([^`]+)`", block, re.M) + list(also)
    assert len(known) >= 3, f"no start-up warnings table in docs/docker.md: {known}"
    return [
        line
        for line in logs.splitlines()
        if WARNING_LINE.search(line) and not any(k in line for k in known)
    ]
