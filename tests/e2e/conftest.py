"""Fixtures for the end-to-end tests: entrypoint.py serving the tiny model with real vLLM CPU."""

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

from tests.harness import ROOT, Server, alive, descendants, free_port, shm_segments
from vllm_intel.supervisor import janitor


@pytest.fixture(scope="module")
def spares():
    """Servers started ahead (serve.ahead) for a later test of the module, by their arguments;
    those no test took stop at the module's end."""
    pool: dict[tuple, list[Server]] = {}
    yield pool
    for s in [s for left in pool.values() for s in left]:
        stop(s)


@pytest.fixture
def serve(tmp_path, tiny_model, spares):
    """Start `entrypoint.py serve TINY [flags]` with its own TMPDIR and state file.

    serve.ahead(same arguments), called before this test's serve(), starts a later test's server
    beside this one (an eager start is mostly one core's work: processes importing vLLM in turn);
    this test's serve() returns once both are ready, and the later serve() with those arguments
    takes it, ready and never used, instead of starting its own."""
    servers, pending = [], []

    def launch(flags, drain, prefix, tmp, model, env, log: str) -> Server:
        port = free_port()
        # short: IPC socket paths
        tmp = tmp or pathlib.Path(tempfile.mkdtemp(prefix="e2e-", dir="/tmp"))
        env = {
            "TMPDIR": str(tmp),
            "INTEL_VLLM_DRAIN_TIMEOUT": str(drain),
            "INTEL_VLLM_STATE_FILE": str(tmp / f"state-{port}.json"),
            **(env or {}),
        }
        s = Server(
            [
                *prefix,
                sys.executable,
                str(ROOT / "entrypoint.py"),
                "serve",
                *([str(tiny_model) if model is None else model] if model != "" else []),
                "--port",
                str(port),
                *flags,
            ],
            port,
            tmp_path / log,
            env,
        )
        s.tmp = tmp
        return s

    def start(
        *flags: str,
        drain: int = 30,
        wait: bool = True,
        prefix: tuple[str, ...] = (),
        tmp: pathlib.Path | None = None,
        model: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Server:
        """prefix: a command the supervisor runs under (e.g. unshare); tmp: a TMPDIR to share;
        model: what to serve instead of the tiny model ("" = none: INTEL_VLLM_MODEL decides);
        env: more environment for the supervisor."""
        key = spec(flags, drain, prefix, model, env)
        if wait and tmp is None and spares.get(key):
            s = spares[key].pop()  # still serving: ready() below says so again
        else:
            s = launch(flags, drain, prefix, tmp, model, env, f"server-{len(servers)}.log")
        servers.append(s)
        if not wait:
            return s
        for each in [s, *(spare for _, spare in pending)]:
            ready(each)
        for key, spare in pending:  # for a later test now, ready
            spares.setdefault(key, []).append(spare)
        pending.clear()
        return s

    def ahead(*flags: str, drain: int = 30, model=None, env=None) -> None:
        assert not servers, "serve.ahead() comes before this test's own serve()"
        s = launch(flags, drain, (), None, model, env, f"ahead-{len(pending)}.log")
        pending.append((spec(flags, drain, (), model, env), s))

    start.ahead = ahead
    yield start
    for s in [s for _, s in pending] + servers:  # pending: this test failed before they were ready
        stop(s)


def spec(flags, drain, prefix, model, env) -> tuple:
    """What makes two servers of serve() the same (the ports and TMPDIR aside)."""
    return (flags, drain, prefix, model, tuple(sorted((env or {}).items())))


def ready(s: Server) -> None:
    s.wait_ready()
    s.model = s.model_name()
    # The supervisor sees /health on its own schedule (every tick); then probes pass.
    wait_for(lambda: probe(s, "ready") == 0, timeout=30, what="probe ready after /health")
    snapshot(s)


def stop(s: Server) -> None:
    # A server left running stops as a user's would (its drain, its cleanup), so the host's
    # /dev/shm keeps no leftovers for the next tests; then nothing may remain.
    if s.proc.poll() is None:
        s.signal(signal.SIGTERM)
        s.wait(timeout=60)
    s.kill_all()
    shutil.rmtree(s.tmp, ignore_errors=True)


def snapshot(s: Server) -> None:
    """Remember the server's processes and shared memory, to check nothing outlives it."""
    s.family = [s.pid] + descendants(s.pid)
    s.shm = shm_segments(s.family)


def wait_for(predicate, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.2)


def probe(s: Server, kind: str) -> int:
    return subprocess.run(
        [sys.executable, str(ROOT / "entrypoint.py"), "probe", kind, "--port", str(s.port)],
        env=s.env,
        capture_output=True,
    ).returncode


def assert_nothing_left(s: Server, expect_shm: bool = True) -> None:
    assert alive(s.family) == [], f"processes left behind: {alive(s.family)}"
    if expect_shm:  # a serving vLLM maps psm_* segments; else the check below proves nothing
        assert s.shm, "no shared memory seen"
    assert {p for p in s.shm if os.path.exists(p)} == set()
    # Intel OpenMP's registrations are never mapped (s.shm cannot see them): by their pids
    pids = {str(pid) for pid in s.family}
    kmp = [f.name for f in pathlib.Path("/dev/shm").glob("__KMP_REGISTERED_LIB_*")]
    assert [n for n in kmp if janitor.registered_by(n, pids)] == [], kmp
    assert list(s.tmp.iterdir()) == [], list(s.tmp.iterdir())  # run dir and state file gone
