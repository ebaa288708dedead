"""entrypoint.py serving the tiny model with real vLLM CPU: drain, refusal, deadline, leftovers.

Each test starts its own server (~25-60 s on 2 cores); they are marked slow and vllm.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import shutil
import sys
import tempfile
import time

import pytest
import requests

from tools.serving import Server, Streams, alive, descendants, free_port, stream_completion, \
    wait_until_tokens_flow

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture
def serve(tmp_path, tiny_model):
    """Start `entrypoint.py serve TINY [flags]` with its own TMPDIR and state file."""
    servers = []

    def start(*flags: str, drain: int = 30) -> Server:
        port = free_port()
        tmp = pathlib.Path(tempfile.mkdtemp(prefix="e2e-", dir="/tmp"))  # short: IPC socket paths
        env = {"TMPDIR": str(tmp), "INTEL_VLLM_DRAIN_TIMEOUT": str(drain),
               "INTEL_VLLM_STATE_FILE": str(tmp / "state.json")}
        s = Server([sys.executable, str(ROOT / "entrypoint.py"), "serve", str(tiny_model),
                    "--port", str(port), *flags], port, tmp_path / f"server-{len(servers)}.log", env)
        s.tmp = tmp
        servers.append(s)
        s.wait_ready()
        s.model = s.model_name()
        s.shm_before = set(os.listdir("/dev/shm"))
        s.family = [s.pid] + descendants(s.pid)
        return s

    yield start
    for s in servers:
        s.kill_all()
        shutil.rmtree(s.tmp, ignore_errors=True)


def probe(s: Server, kind: str) -> int:
    return subprocess.run([sys.executable, str(ROOT / "entrypoint.py"), "probe", kind, "--port",
                           str(s.port)], env=s.env, capture_output=True).returncode


def assert_nothing_left(s: Server) -> None:
    assert alive(s.family) == [], f"processes left behind: {alive(s.family)}"
    new_shm = set(os.listdir("/dev/shm")) - s.shm_before
    assert not {n for n in new_shm if n.startswith(("psm_", "sem.mp-"))}, new_shm
    assert list(s.tmp.iterdir()) == [], list(s.tmp.iterdir())  # run dir and state file gone


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_sigterm_mid_stream_drains_every_request(serve, mode):
    s = serve(*(["--enforce-eager"] if mode == "eager" else []))
    assert probe(s, "ready") == 0
    streams = Streams(s.url, s.model, n=8, max_tokens=3000)
    wait_until_tokens_flow(s.url, running=8)
    t_term = s.signal(signal.SIGTERM)
    time.sleep(0.5)
    assert probe(s, "ready") == 1  # out of rotation while draining
    t0 = time.monotonic()
    refused = requests.post(s.url + "/v1/completions", timeout=10,
                            json={"model": s.model, "prompt": "x", "max_tokens": 5})
    assert refused.status_code == 503 and time.monotonic() - t0 < 2
    results = streams.join()
    code = s.wait(timeout=60)
    print(f"{mode}: exit {code} {time.monotonic() - t_term:.1f} s after SIGTERM; "
          f"last stream ended {max(r.ended for r in results) - t_term:.1f} s after it")
    assert [r.done and r.finish_reason == "length" and r.tokens == 3000 for r in results] == [True] * 8, results
    assert code == 0, s.tail()
    assert "8 in flight at SIGTERM, 8 finished, 0 aborted" in s.text()
    assert_nothing_left(s)


def test_request_longer_than_the_drain_gets_a_final_event(serve):
    s = serve("--enforce-eager", drain=4)
    streams = Streams(s.url, s.model, n=1, max_tokens=8000)
    wait_until_tokens_flow(s.url)
    t_term = s.signal(signal.SIGTERM)
    (result,) = streams.join(timeout=60)
    code = s.wait(timeout=4 + 10 + 2)
    took = time.monotonic() - t_term
    print(f"long request: {result.tokens} tokens, finish {result.finish_reason}, exit {code} "
          f"after {took:.1f} s")
    assert result.terminal and result.done, result
    assert result.finish_reason == "abort", result
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
    assert_nothing_left(s)
