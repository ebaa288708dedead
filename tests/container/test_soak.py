"""Stop/start cycles of one container with the same volumes, each stop during traffic.

Not part of `make test` (about 20 x 65 s): run it with `make soak` (CYCLES=20 by default).
Every start must become healthy, every stop must drain the streams in flight and exit 0, and
/dev/shm, /tmp and the open files of the supervisor must not grow from one cycle to the next.
Once, the container is SIGKILLed mid-stream (a crash): the next start must find the dead run's
leftovers, say so and remove them, and serve.

/dev/shm is a host tmpfs directory bind-mounted into the container, as Kubernetes does with the
`emptyDir: {medium: Memory}` of deploy/k8s: it outlives a container restart, so a crashed run's
psm_* segments are still there at the next start (vllm#54002: the CrashLoopBackOff). Docker's own
`shm_size` mount is new at every start and would hide that case.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
import time

import pytest

from tests.harness import DEFAULT_VLLM, ROOT, Streams, docker
from vllm_intel.supervisor import timing

from .conftest import holds_kernels

pytestmark = [pytest.mark.docker, pytest.mark.soak]

CYCLES = int(os.environ.get("CYCLES", "20"))
CRASH_AT = (CYCLES - 1) // 2  # of 2 cycles the first: then the start after it, a drained stop


def usage(cid: str) -> dict[str, int]:
    out = docker(
        "exec",
        cid,
        "/opt/venv/bin/python",
        "-c",
        """
import os
def size(d):  # the run's claim aside: its length follows the pids it names, not a leak
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs
               if os.path.exists(os.path.join(r, f)) and not f.startswith('vllm-intel-run-'))
supervisor = open('/proc/1/task/1/children').read().split()[0]  # tini's one child
print(size('/dev/shm'), len(os.listdir('/tmp')), len(os.listdir(f'/proc/{supervisor}/fd')))
""",
    ).stdout.split()
    return dict(zip(("shm_bytes", "tmp_entries", "supervisor_fds"), map(int, out)))


def wait_healthy(c, timeout: float = 600) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if c.inspect()["State"].get("Health", {}).get("Status") == "healthy":
            return time.monotonic() - t0
        time.sleep(1)
    raise AssertionError(f"not healthy after {timeout} s:\n{c.logs()}")


@pytest.fixture
def persistent_shm():
    """A host tmpfs directory for /dev/shm (an emptyDir of medium Memory) and the compose file
    that mounts it; yields (directory, compose file)."""
    host_shm = pathlib.Path(
        tempfile.mkdtemp(
            prefix="vllm-intel-soak-shm-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
        )
    )
    host_shm.chmod(0o1777)  # like an emptyDir: the image's non-root user writes here
    override = ROOT / "build" / f"{host_shm.name}.compose.yaml"
    override.parent.mkdir(exist_ok=True)
    override.write_text(
        "services:\n  vllm-cpu:\n    volumes:\n"
        f"      - {{type: bind, source: {host_shm}, target: /dev/shm}}\n"
    )
    yield host_shm, str(override)
    override.unlink(missing_ok=True)
    shutil.rmtree(host_shm, ignore_errors=True)


def segments(host_shm: pathlib.Path) -> tuple[int, int]:
    files = [f for f in host_shm.iterdir() if f.is_file()]
    return len(files), sum(f.stat().st_size for f in files)


def test_stop_start_cycles_under_traffic(cpu_image, compose_project, persistent_shm, compile_cache):
    host_shm, override = persistent_shm
    c = compose_project(cpu_image(DEFAULT_VLLM), overrides=(override,))
    c.env["INTEL_VLLM_CACHE"] = str(compile_cache)  # cycles, not a cold start, are tested here
    warm = holds_kernels(compile_cache)
    c("up", "-d", "--wait", timeout=900)
    if warm:  # an earlier container of the run compiled the same graphs into the shared cache
        assert "compile cache hit" in c("logs", "--no-color").stdout, c.logs()
    cid = c.container()
    model = c.served_model()
    seen, crashes_recovered, drained, streams_done = [], 0, 0, 0
    left_by_crash, left_by_crash_names, left_by_crash_inodes = (0, 0), [], {}
    for cycle in range(CYCLES):
        if cycle:
            docker("start", cid)
            took = wait_healthy(c)
            print(f"cycle {cycle}: healthy after {took:.0f} s")
        if cycle == CRASH_AT + 1:
            log = docker("logs", "--since", "5m", cid)
            lines = [
                line for line in (log.stdout + log.stderr).splitlines() if "stale leftover" in line
            ]
            assert lines, c.logs()
            print(f"cycle {cycle}: {lines[-1][:300]}")
            # Every segment the crash left on the volume was found and removed. Intel OpenMP
            # names its registration by pid, which the container reuses: the new run's own
            # file of that name is another inode.
            for name in left_by_crash_names:
                assert f"/dev/shm/{name}" in lines[-1], (name, lines[-1])
                now = host_shm / name
                assert not now.exists() or now.stat().st_ino != left_by_crash_inodes[name], name
            crashes_recovered += 1
        seen.append(usage(cid))
        streams = Streams(c.url, model, n=4, max_tokens=3000, timeout=120)
        try:
            streams.wait_flowing(timeout=90)
        except TimeoutError:
            raise AssertionError(f"cycle {cycle}: streams never ran: {streams.join()}\n{c.logs()}")
        if cycle == CRASH_AT:
            docker("kill", "-s", "KILL", cid)
            streams.join()
            left_by_crash = segments(host_shm)
            left_by_crash_names = sorted(f.name for f in host_shm.iterdir())
            left_by_crash_inodes = {f.name: f.stat().st_ino for f in host_shm.iterdir()}
            print(
                f"cycle {cycle}: SIGKILL left {left_by_crash[0]} file(s), "
                f"{left_by_crash[1] / 2**20:.0f} MiB in /dev/shm: {left_by_crash_names}"
            )
            assert left_by_crash[0] > 0, "the crash left nothing behind: the case is not exercised"
            continue
        docker("stop", "-t", str(timing.grace_period(timing.DEFAULT_DRAIN_S)), cid, timeout=120)
        results = streams.join()
        state = c.inspect()["State"]
        assert state["ExitCode"] == 0, c.logs()
        assert all(r.done and r.finish_reason == "length" for r in results), results
        # A drained stop cleans up after itself: nothing of the run stays on the volume.
        assert segments(host_shm) == (0, 0), sorted(f.name for f in host_shm.iterdir())
        drained += 1
        streams_done += len(results)
    print("usage per cycle:", seen)
    print(
        f"summary: {CYCLES} cycles, {drained} drained stops ({streams_done} streams, all [DONE]), "
        f"1 SIGKILL, {left_by_crash[0]} leftover file(s) ({left_by_crash[1] / 2**20:.0f} MiB) "
        f"found and removed at the next start"
    )
    assert crashes_recovered == 1
    # Nothing accumulates: the last cycle uses no more than the second one (the first one warms
    # up); two cycles have none to compare with.
    for key in ("shm_bytes", "tmp_entries", "supervisor_fds"):
        assert seen[-1][key] <= seen[1][key], (key, seen)
