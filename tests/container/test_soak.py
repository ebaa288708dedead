"""Stop/start cycles of one container with the same volumes, each stop during traffic (issue 7).

Not part of `make test` (about 20 x 40 s): run it with `make soak` (CYCLES=20 by default).
Every start must become healthy, every stop must drain the streams in flight and exit 0, and
/dev/shm, /tmp and the open files of PID 1 must not grow from one cycle to the next. Once, the
container is SIGKILLed mid-stream (a crash): the next start must find the dead run's leftovers in
/tmp, say so and remove them, and serve.
"""

from __future__ import annotations

import os
import time

import pytest

from tools.serving import Streams, wait_until_tokens_flow

from .conftest import DEFAULT_VLLM, docker

pytestmark = [pytest.mark.docker, pytest.mark.soak]

CYCLES = int(os.environ.get("CYCLES", "20"))
CRASH_AT = CYCLES // 2


def usage(cid: str) -> dict[str, int]:
    out = docker("exec", cid, "/opt/venv/bin/python", "-c", """
import os
def size(d):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs
               if os.path.exists(os.path.join(r, f)))
print(size('/dev/shm'), len(os.listdir('/tmp')), len(os.listdir('/proc/1/fd')))
""").stdout.split()
    return dict(zip(("shm_bytes", "tmp_entries", "pid1_fds"), map(int, out)))


def wait_healthy(c, timeout: float = 600) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if c.inspect()["State"].get("Health", {}).get("Status") == "healthy":
            return time.monotonic() - t0
        time.sleep(1)
    raise AssertionError(f"not healthy after {timeout} s:\n{c.logs()}")


def test_stop_start_cycles_under_traffic(cpu_image, compose_project):
    c = compose_project(cpu_image(DEFAULT_VLLM))
    c("up", "-d", "--wait", timeout=900)
    cid = c.container()
    model = c.served_model()
    seen, crashes_recovered = [], 0
    for cycle in range(CYCLES):
        if cycle:
            docker("start", cid)
            took = wait_healthy(c)
            print(f"cycle {cycle}: healthy after {took:.0f} s")
        if cycle == CRASH_AT + 1:
            log = docker("logs", "--since", "5m", cid)
            assert "stale leftover" in log.stdout + log.stderr, c.logs()
            crashes_recovered += 1
        seen.append(usage(cid))
        streams = Streams(c.url, model, n=4, max_tokens=3000, timeout=120)
        try:
            wait_until_tokens_flow(c.url, running=4, timeout=90)
        except TimeoutError:
            raise AssertionError(f"cycle {cycle}: streams never ran: {streams.join()}\n{c.logs()}")
        if cycle == CRASH_AT:
            docker("kill", "-s", "KILL", cid)
            streams.join()
            continue
        docker("stop", "-t", "45", cid, timeout=120)
        results = streams.join()
        state = c.inspect()["State"]
        assert state["ExitCode"] == 0, c.logs()
        assert all(r.done and r.finish_reason == "length" for r in results), results
    print("usage per cycle:", seen)
    assert crashes_recovered == 1
    # Nothing accumulates: the last cycle uses no more than the second one (the first one warms up).
    for key in ("shm_bytes", "tmp_entries", "pid1_fds"):
        assert seen[-1][key] <= seen[1][key], (key, seen)
