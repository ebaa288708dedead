"""The CPU image in the container it is given: plain `docker run` (Docker's 64 MiB /dev/shm) fails
in one line within seconds; with the README's flags plus a CPU quota and a memory limit it logs
its plan (threads from the quota, not pinned; KV cache from the limit) and serves."""

from __future__ import annotations

import time
import uuid

import pytest
import requests

from tests.harness import free_port
from vllm_intel.supervisor.settings import Exit

from .conftest import docker

pytestmark = [pytest.mark.docker]


def test_plain_docker_run_fails_in_one_line_naming_the_fix(cpu_image):
    t0 = time.monotonic()
    out = docker("run", "--rm", cpu_image(), timeout=120, check=False)
    took = time.monotonic() - t0
    assert out.returncode == Exit.CONFIG, out.stderr[-3000:]
    assert out.stderr.count("\n") == 1, out.stderr[-3000:]
    assert "/dev/shm has 64 MiB free" in out.stderr and "docker run --shm-size=1g" in out.stderr
    assert took < 20, f"{took:.0f} s"


@pytest.mark.slow
def test_under_a_quota_and_memory_limit_it_logs_the_plan_and_serves(cpu_image):
    port, name = free_port(), f"vllm-intel-limits-{uuid.uuid4().hex[:8]}"
    docker(
        "run", "-d", "--name", name, "--shm-size", "1g", "--cpus", "1", "--memory", "4g",
        "-p", f"127.0.0.1:{port}:8000", cpu_image(),
    )  # fmt: skip
    try:
        end = time.monotonic() + 300
        while time.monotonic() < end:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            state = docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip()
            assert state == "true", docker("logs", name, check=False).stderr[-4000:]
            time.sleep(1)
        else:
            pytest.fail("not healthy in 300 s:\n" + docker("logs", name).stderr[-4000:])
        out = docker("logs", name)
        logs = out.stderr + out.stdout  # the entrypoint logs to stderr, vLLM's logger to stdout
        plan = next(line for line in logs.splitlines() if "] plan: " in line)
        assert "quota 1 CPUs" in plan and "memory.max 4.0 GiB" in plan, plan
        # 4 GiB - 10 % - 2 GiB runtime - 400 MiB shm -> 1 GiB; threads: one, not pinned
        assert "VLLM_CPU_KVCACHE_SPACE=1" in plan, plan
        assert "VLLM_CPU_OMP_THREADS_BIND=nobind" in plan and "OMP_NUM_THREADS=1" in plan, plan
        # vLLM took it: its OpenMP report says it binds nothing, and vLLM runs with one OpenMP
        # thread in its environment (the API server's: the engine core and worker inherit it,
        # their own /proc/PID/environ is overwritten by their process titles)
        assert "VLLM_CPU_OMP_THREADS_BIND='nobind'" in logs, logs[-4000:]
        probe = (
            "import psutil\n"
            "api = psutil.Process(1).children()[0]\n"
            "print(api.environ().get('OMP_NUM_THREADS'))"
        )
        got = docker("exec", name, "/opt/venv/bin/python", "-c", probe).stdout.strip()
        assert got == "1", got
        r = requests.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": "/opt/vllm-intel/models/tiny-llama", "prompt": "a", "max_tokens": 8},
            timeout=60,
        )
        assert r.status_code == 200, r.text
    finally:
        docker("rm", "-f", name, check=False, timeout=120)
