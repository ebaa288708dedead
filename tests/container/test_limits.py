"""The CPU image in the container it is given: plain `docker run` (Docker's 64 MiB /dev/shm) fails
in one line within seconds; with the README's flags plus a CPU quota and a memory limit, as an
arbitrary uid in group 0 (OpenShift's restricted SCC), it logs its plan (threads from the quota,
not pinned; KV cache from the limit; shm queue readers woken by their writer), serves, and drains
on `docker stop`."""

from __future__ import annotations

import json
import pathlib
import re
import threading
import time
import uuid

import pytest
import requests

from tests.harness import Container, Streams, docker, patch_line, wake_words
from vllm_intel.supervisor import plan, timing, workload
from vllm_intel.supervisor.errors import Exit
from vllm_intel.supervisor.limits import MiB

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


@pytest.fixture(scope="module")
def cpuset_container(cpu_image):
    """The cpuset test's container, started by the test before it so the two starts overlap: the
    quota's one CPU beside the cpuset's one of this host's two (a start is mostly one core's)."""
    name = f"vllm-intel-cpuset-{uuid.uuid4().hex[:8]}"
    args = ["--shm-size", "1g", "--cpuset-cpus", "1", "--memory", "5g"]
    with Container(name, cpu_image(), args, ["serve", "--enforce-eager"]) as c:
        yield c


@pytest.mark.slow
@pytest.mark.usefixtures("cpuset_container")
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
            "api = psutil.Process(1).children()[0].children()[0]\n"  # tini > supervisor > API
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
def test_under_a_cpuset_and_memory_limit_it_logs_the_plan_and_serves(cpuset_container):
    """A cpuset is no quota below the CPUs it allows: vLLM's own thread choice over that one CPU
    stays, and so does its shm readers' spin (one CPU: nothing to spin beside), the KV cache
    still comes from the memory limit."""
    c = cpuset_container
    try:
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
    finally:
        c.remove()  # idle, its readers spin on the CPU the next tests need


class ProcessMemory(threading.Thread):
    """Each process's peak resident memory (anonymous + shared: what an OOM kill counts), read on
    the host from /proc/PID/status every SAMPLE_S for the pids `docker top` gives once."""

    SAMPLE_S = 0.25

    def __init__(self, container: str):
        super().__init__(daemon=True)
        rows = docker("top", container, "-eo", "pid,args").stdout.splitlines()[1:]
        self.args = {int(r.split(None, 1)[0]): r.split(None, 1)[1] for r in rows}
        self.peak = dict.fromkeys(self.args, 0)
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.SAMPLE_S):
            for pid in self.peak:
                try:
                    status = pathlib.Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                kib = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
                # a zombie has no memory lines
                now = sum(int(kib.get(k, "0").split()[0]) * 1024 for k in ("RssAnon", "RssShmem"))
                self.peak[pid] = max(self.peak[pid], now)

    def by_role(self) -> dict[str, list[int]]:
        """Peaks per role of the plan's model (plan.processes), by process title."""
        roles: dict[str, list[int]] = {"API server": [], "engine core": [], "worker": []}
        for pid, args in self.args.items():
            if args.startswith("VLLM::Worker"):
                roles["worker"].append(self.peak[pid])
            elif args.startswith("VLLM::EngineCore"):
                roles["engine core"].append(self.peak[pid])
            elif " serve" in args and "entrypoint.py" not in args:
                roles["API server"].append(self.peak[pid])
        return roles


@pytest.mark.slow
def test_tensor_parallel_under_a_memory_limit_is_refused_below_every_process_then_serves(
    cpu_image,
):
    """Two workers, each with its own KV cache, in a container with a memory limit: below what
    every process holds, refused in one line naming the smallest limit that fits; at that limit it
    serves, every process stays inside the plan's allowance for its role, and `docker stop` drains
    the streams and exits 0, without an OOM kill."""
    flags = ["--tensor-parallel-size", "2", "--enforce-eager", "--max-model-len", "512"]
    refused = docker(
        "run", "--rm", "--shm-size", "2g", "--memory", "4g", cpu_image(), "serve", *flags,
        timeout=120, check=False,
    )  # fmt: skip
    assert refused.returncode == Exit.CONFIG, refused.stderr[-3000:]
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "x 2 workers" in refused.stderr and "2 workers" in refused.stderr, refused.stderr
    named = re.search(r"to at least ([0-9]+) GiB", refused.stderr)
    assert named, refused.stderr
    limit = f"{named.group(1)}g"
    name = f"vllm-intel-tp-limit-{uuid.uuid4().hex[:8]}"
    args = ["--shm-size", "2g", "--memory", limit, "--memory-swap", limit]
    with Container(name, cpu_image(), args, ["serve", *flags]) as c:
        c.wait_ready(400)
        plan_line = next(line for line in c.logs().splitlines() if "] plan: " in line)
        kv = int(re.search(r"VLLM_CPU_KVCACHE_SPACE=([0-9]+)", plan_line).group(1))
        assert "per worker x 2 workers" in plan_line, plan_line
        sampler = ProcessMemory(name)
        sampler.start()
        streams = Streams(c.url, "/opt/vllm-intel/models/tiny-llama", n=4, max_tokens=300)
        assert streams.wait_started(60)
        grace = timing.grace_period(timing.DEFAULT_DRAIN_S)
        docker("stop", "-t", str(grace), name, timeout=grace + 30)
        results = streams.join(60)
        sampler.done.set()
        sampler.join()
        state = json.loads(docker("inspect", "-f", "{{json .State}}", name).stdout)
        assert [(r.done, r.finish_reason) for r in results] == [(True, "length")] * 4, results
        assert state["ExitCode"] == 0 and not state["OOMKilled"], (state, c.logs()[-3000:])
    work = workload.Workload(2, 1, 0, tiny_weights(), dp=1)
    allowed = {p.role: p.runtime + p.weights + p.kv for p in plan.processes(work, kv)}
    roles = sampler.by_role()
    print(f"limit {limit}, KV {kv} GiB per worker; peak MiB per process:",
          {r: [round(b / MiB) for b in v] for r, v in roles.items()},
          "allowed:", {r: round(b / MiB) for r, b in allowed.items()})  # fmt: skip
    assert [len(roles[r]) for r in ("API server", "engine core", "worker")] == [1, 1, 2], (
        sampler.args
    )
    for role, peaks in roles.items():
        assert max(peaks) <= allowed[role], (role, peaks, allowed)


def tiny_weights() -> int:
    """The built-in model's weight bytes, as the image's plan counted them (the same build)."""
    return workload.weights_bytes(str(pathlib.Path("build/tiny-llama").resolve())) or 0
