"""The CPU image in the container it is given: plain `docker run` (Docker's 64 MiB /dev/shm) fails
in one line within seconds; with the README's flags plus a CPU quota and a memory limit, as an
arbitrary uid in group 0 (OpenShift's restricted SCC), it logs its plan (threads from the quota,
not pinned; KV cache from the limit; shm queue readers woken by their writer), serves, and drains
on `docker stop`."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import requests

from tests.harness import Container, Streams, docker, patch_line, wake_words
from vllm_intel.supervisor import timing
from vllm_intel.supervisor.errors import Exit

pytestmark = [pytest.mark.docker]
UID = 12345  # no entry in the image's /etc/passwd


def test_plain_docker_run_fails_in_one_line_naming_the_fix(cpu_image):
    t0 = time.monotonic()
    out = docker("run", "--rm", cpu_image(), timeout=120, check=False)
    took = time.monotonic() - t0
    assert out.returncode == Exit.CONFIG, out.stderr[-3000:]
    assert out.stderr.count("\n") == 1, out.stderr[-3000:]
    assert "/dev/shm has 64 MiB free" in out.stderr and "docker run --shm-size=1g" in out.stderr
    assert took < 20, f"{took:.0f} s"


@pytest.mark.slow
def test_an_arbitrary_uid_under_a_quota_and_memory_limit_logs_the_plan_serves_and_drains(
    cpu_image,
):
    """`--cpus 1 --memory 4g` of 2+ CPUs: one OpenMP thread, not pinned (every vLLM process may
    run on every CPU the container sees), the KV cache from the limit, the shm queue readers
    woken by their writer instead of spinning beside the work; it serves. As uid 12345 in group
    0: it writes what vLLM writes at run time into HOME's cache (group 0 has the owner's rights),
    and a `docker stop` with streams in flight drains them and exits 0."""
    name = f"vllm-intel-limits-{uuid.uuid4().hex[:8]}"
    args = ["--user", f"{UID}:0", "--shm-size", "1g", "--cpus", "1", "--memory", "4g"]
    # eager: torch.compile under a one-CPU quota doubled the test's time; the plan does not
    # depend on it (as the cpuset test below)
    with Container(name, cpu_image(), args, ["serve", "--enforce-eager"]) as c:
        c.wait_ready(300)
        logs = c.logs()
        plan = next(line for line in logs.splitlines() if "] plan: " in line)
        assert "quota 1 CPUs" in plan and "memory.max 4.0 GiB" in plan, plan
        # 4 GiB - 10 % - 2 GiB runtime - 400 MiB shm -> 1 GiB; threads: one, not vLLM's binding
        assert "VLLM_CPU_KVCACHE_SPACE=1" in plan, plan
        assert "VLLM_CPU_OMP_THREADS_BIND=nobind" in plan and "OMP_NUM_THREADS=1" in plan, plan
        assert "not pinned" in plan, plan
        # the shm queue readers wait for their writer (shm-busy-sleep)
        assert "VLLM_SHM_BROADCAST_BUSY_SLEEP_S=0.0001" in plan, plan
        for proc in ("EngineCore", "Worker"):
            line = patch_line(logs, proc)
            assert "shm-busy-sleep=applied" in line, line
        # vLLM took it: its OpenMP report says it binds nothing, and vLLM runs with one OpenMP
        # thread in its environment (the API server's: the engine core and worker inherit it,
        # their own /proc/PID/environ is overwritten by their process titles)
        assert "VLLM_CPU_OMP_THREADS_BIND='nobind'" in logs, logs[-4000:]
        probe = (
            "import json, psutil\n"
            "api = psutil.Process(1).children()[0]\n"
            "print(api.environ().get('OMP_NUM_THREADS'))\n"
            "tree = [api] + api.children(recursive=True)\n"
            "print(json.dumps([[p.name(), sorted(p.cpu_affinity())] for p in tree]))\n"
            "print(json.dumps(sorted(api.parent().cpu_affinity())))"
        )
        out = docker("exec", c.name, "/opt/venv/bin/python", "-c", probe).stdout.splitlines()
        assert out[0] == "1", out
        # nothing pinned: vLLM's processes may run where the supervisor may
        tree, supervisor = json.loads(out[1]), json.loads(out[2])
        assert len(tree) >= 3 and len(supervisor) > 1, (tree, supervisor)
        assert all(cpus == supervisor for _, cpus in tree), (tree, supervisor)
        r = requests.post(
            c.url + "/v1/completions",
            json={"model": "/opt/vllm-intel/models/tiny-llama", "prompt": "a", "max_tokens": 8},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        # ... by the futex wake-up, not the fallback sleep: one word per queue (the engine core's
        # to the worker, the worker's back), in the container's /dev/shm
        assert len(wake_words(c.name)) == 2, wake_words(c.name)
        assert "no futex wake-up" not in c.logs(), c.logs()[-3000:]

        assert docker("exec", name, "id", "-u").stdout.strip() == str(UID)
        # What this uid wrote under HOME's cache (vLLM's model info, the compile cache dirs).
        mine = docker(
            "exec", name, "find", "/home/vllm/.cache", "-uid", str(UID), "-print"
        ).stdout.split()
        assert mine, docker("exec", name, "ls", "-laR", "/home/vllm/.cache").stdout
        streams = Streams(c.url, "/opt/vllm-intel/models/tiny-llama", n=2, max_tokens=1500)
        assert streams.wait_started(60)
        t0 = time.monotonic()
        grace = timing.grace_period(timing.DEFAULT_DRAIN_S)
        docker("stop", "-t", str(grace), name, timeout=grace + 30)
        took = time.monotonic() - t0
        results = streams.join(60)
        code = docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip()
        print(f"uid {UID}: stop took {took:.1f} s, exit {code}, wrote {len(mine)} file(s)")
        assert [(r.done, r.finish_reason, r.tokens) for r in results] == [
            (True, "length", 1500)
        ] * 2, (results, c.logs()[-3000:])
        assert code == "0", c.logs()[-3000:]


@pytest.mark.slow
def test_under_a_cpuset_and_memory_limit_it_logs_the_plan_and_serves(cpu_image):
    """A cpuset is no quota below the CPUs it allows: vLLM's own thread choice over that one CPU
    stays, and so does its shm readers' spin (one CPU: nothing to spin beside), the KV cache
    still comes from the memory limit."""
    name = f"vllm-intel-cpuset-{uuid.uuid4().hex[:8]}"
    args = ["--shm-size", "1g", "--cpuset-cpus", "1", "--memory", "5g"]
    with Container(name, cpu_image(), args, ["serve", "--enforce-eager"]) as c:
        c.wait_ready(300)
        plan = next(line for line in c.logs().splitlines() if "] plan: " in line)
        assert "CPUs 1 (1)" in plan and "memory.max 5.0 GiB" in plan, plan
        assert "vLLM auto over the 1 allowed CPUs" in plan, plan
        assert "OMP_NUM_THREADS" not in plan and "VLLM_CPU_OMP_THREADS_BIND" not in plan, plan
        # one CPU and no quota: vLLM's spin hands that CPU straight to the work, kept
        assert "0 beside its OpenMP threads" in plan, plan
        assert "VLLM_SHM_BROADCAST_BUSY_SLEEP_S" not in plan, plan
        # 5 GiB - 10 % - 2 GiB runtime - 400 MiB shm -> 2 GiB
        assert "VLLM_CPU_KVCACHE_SPACE=2" in plan, plan
        r = requests.post(
            c.url + "/v1/completions",
            json={"model": "/opt/vllm-intel/models/tiny-llama", "prompt": "a", "max_tokens": 8},
            timeout=60,
        )
        assert r.status_code == 200, r.text
