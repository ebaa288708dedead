"""Run entrypoint.py against the fake `vllm serve` in fake_vllm/ (no real vLLM needed)."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests.harness import ROOT, free_port

FAKE = pathlib.Path(__file__).resolve().parent / "fake_vllm"
SIGTERM = signal.SIGTERM  # a default in Run, whose own `signal` method hides the module


def fake_answers(port: int, path: str = "/health") -> bool:
    """GET `path` on the fake vLLM's --port got an HTTP answer, whatever its status."""
    import urllib.error
    import urllib.request

    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        direct.open(f"http://127.0.0.1:{port}{path}", timeout=1).close()
    except urllib.error.HTTPError:
        pass
    except OSError:
        return False
    return True


def fake_env(tmp: pathlib.Path, shm: pathlib.Path | None = None, **extra: str) -> dict[str, str]:
    """The environment of a supervisor of the fake vLLM in `tmp` (its state file and /dev/shm
    stand-in there, or `shm`; tmp/model made), a drain of 1 s, plus `extra`."""
    shm = shm or tmp / "shm"
    for d in (tmp / "model", shm):
        d.mkdir(exist_ok=True)
    env = dict(
        os.environ,
        PYTHONPATH=str(FAKE),
        TMPDIR=str(tmp),
        INTEL_VLLM_STATE_FILE=str(tmp / "state.json"),
        INTEL_VLLM_SHM_DIR=str(shm),
        INTEL_VLLM_DRAIN_TIMEOUT="1",
    )
    return env | extra


class Run:
    def __init__(self, tmp: pathlib.Path, env: dict[str, str], args: list[str] | None = None):
        self.tmp = tmp
        self.port = free_port()
        self.model = tmp / "model"
        self.env = fake_env(tmp, **env)
        argv = args if args is not None else ["serve", str(self.model), "--port", str(self.port)]
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "entrypoint.py"), *argv],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait_for(self, predicate, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"entrypoint exited early:\n{self.proc.stdout.read()}")
            time.sleep(0.05)
        raise AssertionError("condition not reached in time")

    def fake_answers(self, path: str = "/health") -> bool:
        """The fake vLLM's HTTP server answered GET `path` with any status. It starts after the
        fake's signal handlers are installed: from then on a signal reaches its handler."""
        return fake_answers(self.port, path)

    def state(self) -> str | None:
        import json

        try:
            return json.loads((self.tmp / "state.json").read_text())["state"]
        except (OSError, ValueError):
            return None

    def probe(self, kind: str) -> int:
        return subprocess.run(
            [sys.executable, str(ROOT / "entrypoint.py"), "probe", kind, "--port", str(self.port)],
            env=self.env,
            capture_output=True,
        ).returncode

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop_when_serving(self, sig: int = SIGTERM) -> tuple[int, str, float]:
        """Wait for SERVING, send sig, wait for the exit: (code, output, wall time of the send)."""
        self.wait_for(lambda: self.state() == "SERVING")
        sent = time.time()
        self.signal(sig)
        code, out, _ = self.finish()
        return code, out, sent

    def finish(self, timeout: float = 30.0) -> tuple[int, str, float]:
        t0 = time.monotonic()
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            raise AssertionError(f"entrypoint hung:\n{out}")
        return self.proc.returncode, out, time.monotonic() - t0


@pytest.fixture
def tmp_path():
    """A short temporary directory: vLLM's IPC socket paths must fit in 107 bytes, and
    entrypoint.py refuses a TMPDIR longer than that allows (pytest's own paths are too long)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="sv-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def run(tmp_path):
    runs = []

    def start(env: dict[str, str] | None = None, args: list[str] | None = None) -> Run:
        r = Run(tmp_path, env or {}, args)
        runs.append(r)
        return r

    yield start
    for r in runs:
        if r.proc.poll() is None:
            r.proc.send_signal(signal.SIGKILL)
            r.proc.wait()


def serving(run, env: dict[str, str]) -> tuple[Run, int]:
    """run(env) with the probe port on a free port, once the supervisor says SERVING."""
    port = free_port()
    r = run({"INTEL_VLLM_PROBE_PORT": str(port), **env})
    r.wait_for(lambda: r.state() == "SERVING")
    return r, port
