"""A real `vllm serve` (default compile mode, no --enforce-eager) loads the plugin in every process.

Slow: one cold start is ~40-120 s on a 2-core machine (torch.compile), ~25-40 s with a warm
compile cache.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time

import pytest
import requests

import vllm_intel.patches as vip
from tests.harness import ROOT
from tests.harness.patch_states import serve_expectations
from vllm_intel.in_vllm import run_files
from vllm_intel.supervisor.reports import RunReports

READY_TIMEOUT = 240  # generous: a cold torch.compile on a loaded 2-core CI machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_and_complete(venv, model, log_path, extra_env=None, extra_args=()):
    port = _free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", **(extra_env or {}))
    for k in (
        "INTEL_VLLM_PATCHES",
        "INTEL_VLLM_PATCHES_DISABLE",
        "INTEL_VLLM_PATCHES_STRICT",
        "VLLM_PLUGINS",
    ):
        env.pop(k, None) if k not in (extra_env or {}) else None
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                str(venv / "bin" / "vllm"),
                "serve",
                str(model),
                "--max-model-len",
                "1024",
                "--port",
                str(port),
                *extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    result = {"ready_s": None, "status": None, "exit": None}
    try:
        while time.monotonic() - t0 < READY_TIMEOUT and proc.poll() is None:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    result["ready_s"] = round(time.monotonic() - t0, 1)
                    break
            except requests.RequestException:
                pass
            time.sleep(1)
        if result["ready_s"] is not None:
            r = requests.post(
                f"http://127.0.0.1:{port}/v1/completions",
                timeout=60,
                json={"model": str(model), "prompt": "Hello", "max_tokens": 8},
            )
            result["status"] = r.status_code
            proc.send_signal(signal.SIGTERM)
            result["exit"] = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    result["log"] = log_path.read_text(errors="replace")
    return result


def patch_lines(log: str) -> dict[str, str]:
    """{'API server': 'cpu-accelerator-api=applied ...', 'EngineCore': ..., 'Worker': ...}"""
    return {
        m.group(1): m.group(2)
        for m in re.finditer(r"vllm-intel patches \(pid \d+, ([^)]+)\): (.*)$", log, re.M)
    }


def states(line: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in line.split())


# The releases served here: the suite's choice (the vllm-cpu releases that install here), not a
# patch's declaration. What each patch must show on them comes from its declarations.
SERVED = ("0.32.0", "0.27.1")


@pytest.mark.parametrize("version", SERVED)
def test_the_declarations_decide_every_unconditional_patch_served(version):
    """Every patch without a ``condition`` gets an expected state below: its tested range holds
    the served releases (else serve_expectations raises), so no patch goes unchecked."""
    expected = serve_expectations(vip.declarations(), version)
    assert set(expected) == {p.name for p in vip.declarations() if not p.condition}


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("version", SERVED)
def test_vllm_serve_loads_plugin_in_every_process(vllm_venv, tiny_model, tmp_path, version):
    expected = serve_expectations(vip.declarations(), version)
    reports = tmp_path / "run"
    reports.mkdir()
    res = serve_and_complete(
        vllm_venv(version),
        tiny_model,
        tmp_path / "serve.log",
        extra_env={run_files.ENV: str(reports)},
    )
    tail = res["log"][-4000:]
    assert res["ready_s"] is not None, f"not ready in {READY_TIMEOUT}s:\n{tail}"
    assert res["status"] == 200, tail
    assert res["exit"] == 0, tail
    lines = patch_lines(res["log"])
    assert set(lines) == {"API server", "EngineCore", "Worker"}, lines
    for kind, line in lines.items():
        got = states(line)
        assert {k: got.get(k) for k in expected} == expected, (kind, line)
        # the engine core, and only it, watches its parent (its `condition`: the process)
        watch = "applied" if kind == "EngineCore" else "not-applicable"
        assert got.get("engine-parent-watch") == watch, (kind, line)
    # cpu-aot-compile reached the worker (where the model is compiled): no AOT artifact is saved,
    # and so none fails to load at the next start (stock vllm-cpu logs both on every start).
    assert "saved AOT compiled function" not in res["log"], tail
    assert "load failure" not in res["log"], tail
    # (vLLM's default abort-mode shutdown logs an EngineDeadError traceback of its own; only
    # tracebacks through our package (installed: vllm_intel/patches/; the checkout's: patches/) or a
    # failed patch count)
    for ours in ("vllm_intel/patches/", f"{ROOT / 'patches'}/", "vllm-intel patch "):
        assert ours not in res["log"], tail
    # Every process reported its patch states, and vLLM's start-up lines were read as phases
    # (a release that rewords one drops it here first): the model load, torch.compile (this run
    # compiles), the engine's initialisation; the compile is part of one of the other two.
    found = RunReports()
    found.dir = reports
    kinds = {r["process"] for r in found.patch_states()}  # the API server may start a helper too
    assert kinds == {"API server", "EngineCore", "Worker"}, kinds
    phases = found.startup()
    assert {"load", "compile", "engine_init"} <= set(phases), (phases, sorted(os.listdir(reports)))
    assert all(s > 0 for s in phases.values()), phases
    assert phases["compile"] <= phases["load"] + phases["engine_init"], phases
    # torch's FX graph cache hit or missed for every graph the compile made
    assert sum(found.graphs().values()) > 0, found.graphs()
