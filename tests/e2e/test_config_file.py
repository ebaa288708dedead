"""Settings given only through vLLM's `--config FILE.yaml` are the supervisor's too: the port it
watches and names its state file after, and the drain its deadline is computed from.

One real server: the tiny model under entrypoint.py, no --port / --shutdown-timeout on the
command line, INTEL_VLLM_DRAIN_TIMEOUT set to something else that must lose to the file. Its stop
is also the idle stop: nothing in flight, so it exits at once.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import signal
import sys
import tempfile
import time

import pytest
import requests

from tests.harness import ROOT, Server, free_port, threads_of, undocumented_warnings

from .conftest import assert_nothing_left, probe, snapshot, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

FILE_DRAIN = 3  # in the config file
ENV_DRAIN = 30  # what the supervisor would have appended (and so forced) before


def test_port_and_shutdown_timeout_from_a_config_file_and_an_idle_stop(tmp_path, tiny_model):
    """Also: PID 1 serving with the images' defaults (probe port on) runs 3 threads (the loop,
    the observer and the probe port), and an idle SIGTERM exits 0 at once."""
    port, probe_port = free_port(), free_port()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="e2e-", dir="/tmp"))  # short: IPC socket paths
    cfg = tmp_path / "vllm.yaml"
    cfg.write_text(f"port: {port}\nshutdown_timeout: {FILE_DRAIN}\nenforce-eager: true\n")
    state = tmp / f"state-{port}.json"
    env = {
        "TMPDIR": str(tmp),
        "INTEL_VLLM_DRAIN_TIMEOUT": str(ENV_DRAIN),
        "INTEL_VLLM_STATE_FILE": str(state),
        "INTEL_VLLM_PROBE_PORT": str(probe_port),
    }
    argv = [sys.executable, str(ROOT / "entrypoint.py"), "serve", str(tiny_model)]
    s = Server([*argv, "--config", str(cfg)], port, tmp_path / "server.log", env)
    s.tmp = tmp
    try:
        s.wait_ready()
        s.model = s.model_name()
        # The supervisor watches the configured port: its probe turns ready there.
        wait_for(lambda: probe(s, "ready") == 0, timeout=30, what="probe ready on the file's port")
        snapshot(s)
        data = json.loads(state.read_text())
        assert (data["port"], data["drain"], data["state"]) == (port, FILE_DRAIN, "SERVING")
        assert data["url"] == f"http://127.0.0.1:{port}"
        # Nothing appended over the file's value on vLLM's command line.
        child = pathlib.Path(f"/proc/{data['child']}/cmdline").read_bytes().split(b"\0")
        assert b"--config" in child and b"--shutdown-timeout" not in child, child
        ready = requests.get(f"http://127.0.0.1:{probe_port}/ready", timeout=5)
        assert (ready.status_code, ready.text) == (200, "ready: state SERVING\n")
        threads = threads_of(s.pid)
        print(f"supervisor threads while serving: {threads}")
        assert len(threads) <= 3, threads

        t_term = s.signal(signal.SIGTERM)
        code = s.wait(timeout=FILE_DRAIN + 10 + 2)
        took = time.monotonic() - t_term
        print(f"idle stop, config-file drain: exit {code} after {took:.2f} s")
        text = s.text()
        assert code == 0 and took < 3, s.tail()
        assert "forecast at SIGTERM: nothing in flight" in text, s.tail()
        assert f"drain window {FILE_DRAIN} s, hard deadline {FILE_DRAIN + 10} s" in text
        assert f"drain {FILE_DRAIN} s: --shutdown-timeout from the config file" in text
        # vLLM itself resolved the file's value (its own log of the settings and of its drain).
        assert f"'shutdown_timeout': {FILE_DRAIN}" in text and f"'port': {port}" in text
        assert f"timeout={FILE_DRAIN}s" in text, s.tail()
        assert_nothing_left(s)
        # `make run`'s start warns only as the image's does (the file's enforce-eager aside)
        assert "runtime: tcmalloc + Intel OpenMP;" in text, s.tail()
        # The start's lines only. At the stop, vLLM 0.32.0 may warn "force killing remaining
        # process EngineCore" for an EngineCore that has already exited: two of the API server's
        # threads reap it (`monitor_engine_liveness` reads `proc.exitcode`, `shutdown` joins it;
        # vllm/v1/engine/utils.py), and the one that loses gets ECHILD and takes it for alive.
        # Nothing is lost.
        start = text.split("state DRAINING", 1)[0]
        unknown = undocumented_warnings(start, also=("Enforce eager set",))
        assert not unknown, "\n".join(unknown)
    finally:
        s.kill_all()
        shutil.rmtree(tmp, ignore_errors=True)
