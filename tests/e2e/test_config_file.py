"""Settings given only through vLLM's `--config FILE.yaml` are the supervisor's too: the port it
watches and names its state file after, and the drain its deadline is computed from.

One real server (~40 s): the tiny model under entrypoint.py, no --port / --shutdown-timeout on
the command line, INTEL_VLLM_DRAIN_TIMEOUT set to something else that must lose to the file.
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

from tests.harness import ROOT, Server, free_port

from .conftest import assert_nothing_left, probe, snapshot, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

FILE_DRAIN = 3  # in the config file
ENV_DRAIN = 30  # what the supervisor would have appended (and so forced) before


def test_port_and_shutdown_timeout_from_a_config_file(tmp_path, tiny_model):
    port = free_port()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="e2e-", dir="/tmp"))  # short: IPC socket paths
    cfg = tmp_path / "vllm.yaml"
    cfg.write_text(f"port: {port}\nshutdown_timeout: {FILE_DRAIN}\nenforce-eager: true\n")
    state = tmp / f"state-{port}.json"
    env = {
        "TMPDIR": str(tmp),
        "INTEL_VLLM_DRAIN_TIMEOUT": str(ENV_DRAIN),
        "INTEL_VLLM_STATE_FILE": str(state),
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

        t_term = s.signal(signal.SIGTERM)
        code = s.wait(timeout=FILE_DRAIN + 10 + 2)
        print(f"config-file drain: exit {code} after {time.monotonic() - t_term:.1f} s")
        text = s.text()
        assert code == 0, s.tail()
        assert f"drain window {FILE_DRAIN} s, hard deadline {FILE_DRAIN + 10} s" in text
        assert f"drain {FILE_DRAIN} s: --shutdown-timeout from the config file" in text
        # vLLM itself resolved the file's value (its own log of the settings and of its drain).
        assert f"'shutdown_timeout': {FILE_DRAIN}" in text and f"'port': {port}" in text
        assert f"timeout={FILE_DRAIN}s" in text, s.tail()
        assert_nothing_left(s)
    finally:
        s.kill_all()
        shutil.rmtree(tmp, ignore_errors=True)
