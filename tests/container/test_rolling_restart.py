"""Zero failed requests while the replicas are restarted one by one behind a real load balancer.

Two replicas of the CPU image (compose.yaml + compose.replicas.yaml) behind the HAProxy image
(docker/Dockerfile.lb, deploy/haproxy/haproxy.cfg), a client load on the LB's 127.0.0.1 port the
whole time (a client of streams and one of short completions, each one request after the other),
witnesses (streams straight to each replica through its DRAIN step: work for its drain), and
`scripts/rolling-restart.sh` replacing both replicas during it. Every request the clients sent
must get a complete answer: a stream every token and `[DONE]`, a short completion 200 with every
token. Nothing may hang (a client still waiting 180 s after the load stopped is a failure).

To see it catch failures (docs/deploy.md lists what was seen):
  INTEL_VLLM_ROLLING_BARE=1 ...        the replicas run bare `vllm serve` (no drain)
  INTEL_VLLM_LB_CONFIG=/path/cfg ...   another HAProxy config, e.g. without `retry-on`
"""

from __future__ import annotations

import os
import time

import pytest

from tests.harness import build_image
from tests.harness.rolling import DRAIN_S, LOAD, Deployment, rollout, save, summary

pytestmark = [pytest.mark.docker, pytest.mark.slow]

BARE = os.environ.get("INTEL_VLLM_ROLLING_BARE") == "1"
# One client of each kind and no long streams: the witnesses give each drain its work, and the
# lighter load lets a restarted replica start sooner than beside LOAD's six clients (docs/bench.md,
# "rolling restart: the test").
TEST_LOAD = dict(LOAD, streams=1, shorts=1, longs=0)
# The LB's DRAIN step before each `docker stop`: the witnesses sent in it are seconds old at
# SIGTERM, so vLLM's gauges count them (one sent an instant before may not be counted yet).
TEST_LB_DRAIN_S = 3


@pytest.fixture(scope="module")
def lb_image(docker_host) -> str:
    out, took = build_image("lb")
    if out.returncode != 0:
        pytest.fail(f"build-image.sh lb failed:\n{out.stderr[-4000:]}")
    print(f"built vllm-intel:lb in {took:.0f} s")
    return "vllm-intel:lb"


def test_rolling_restart_loses_no_request(cpu_image, lb_image):
    t = time.monotonic()
    dep = Deployment(
        cpu_image(),
        lb_image,
        f"vllm-intel-rolling-{os.getpid()}",
        bare=BARE,
        drain=DRAIN_S,
        lb_drain=TEST_LB_DRAIN_S,
    )
    try:
        up = dep.up()
        result = rollout(dep, warm_s=15, after_s=5, **TEST_LOAD)
    finally:
        dep.down()
    save(result, dep.log_dir / f"{dep.name}.json")
    print(f"\ncompose up --wait {up:.0f} s; whole test {time.monotonic() - t:.0f} s")
    print(result["restart_output"])
    print(summary(result))

    assert result["restart_exit"] == 0, result["restart_output"]
    assert result["restart_output"].count("replaced in") == 2, "both replicas restarted"
    # The load ran through the whole restart, and each replica's drain had work to do (at least
    # a witness: tests/harness/rolling.py), which it finished (none failed, below).
    assert result["during_restart"] >= 10 and result["streams"] >= 10 and result["shorts"] >= 10
    assert result["witnesses"] >= 2, summary(result)
    if not BARE:
        in_flight = result["in_flight_at_sigterm"]
        assert len(in_flight) == 2 and min(in_flight) >= 1, summary(result)
    assert result["hung"] == 0, summary(result)
    assert result["failed"] == 0, summary(result)
