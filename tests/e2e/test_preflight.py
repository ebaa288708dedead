"""The preflight on the real thing: `entrypoint.py serve` (real vLLM installed) with /dev/shm the
size Docker gives by default (a 64 MiB tmpfs mounted over /dev/shm in a mount namespace of its
own) exits 64 within seconds with one line naming the fix, and starts nothing."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from tests.harness import ROOT
from vllm_intel.supervisor.errors import Exit

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare"
    ),
]


def test_docker_default_dev_shm_fails_in_one_line_before_anything_starts(tiny_model):
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="e2e-", dir="/tmp"))  # short: a TMPDIR vLLM accepts
    serve = [sys.executable, str(ROOT / "entrypoint.py"), "serve", str(tiny_model), "--port", "1"]
    script = 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"'
    env = dict(os.environ, TMPDIR=str(tmp), INTEL_VLLM_STATE_FILE=str(tmp / "s.json"))
    env.pop("INTEL_VLLM_SHM_DIR", None)
    start = time.monotonic()
    out = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", *serve],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    took = time.monotonic() - start
    assert out.returncode == Exit.CONFIG, out.stderr[-3000:]
    assert out.stderr.count("\n") == 1, out.stderr[-3000:]
    assert "/dev/shm has 64 MiB free, vLLM needs 400 MiB" in out.stderr
    assert "docker run --shm-size=1g" in out.stderr
    assert took < 15, f"{took:.1f} s: the check must come before vLLM starts"
    # nothing started and nothing left: no run directory, no state file
    left = list(tmp.iterdir())
    shutil.rmtree(tmp)
    assert left == []
