"""Zero failed requests while the replicas are restarted one by one behind a real load balancer.

Two replicas of the CPU image (compose.yaml + compose.replicas.yaml) behind the HAProxy image
(docker/Dockerfile.lb, deploy/haproxy/haproxy.cfg), a client load on the LB's 127.0.0.1 port the
whole time (a client of streams and one of short completions, each one request after the other),
witnesses (streams straight to each replica from its DRAIN step until it refuses one: work for its
drain, tests/harness/rolling.py), and `scripts/rolling-restart.sh` replacing both replicas during
it. Every request the clients sent must get a complete answer: a stream every token and `[DONE]`,
a short completion 200 with every token; a witness may only be refused by the drain's 503. Nothing
may hang (a client still waiting 180 s after the load stopped is a failure).

To see it catch failures (docs/deploy.md lists what was seen):
  INTEL_VLLM_ROLLING_BARE=1 ...        the replicas run bare `vllm serve` (no drain)
  INTEL_VLLM_LB_CONFIG=/path/cfg ...   another HAProxy config, e.g. without `retry-on`
"""

from __future__ import annotations

import http.server
import json
import os
import threading
import time

import pytest

from tests.harness import build_image, poll
from tests.harness.rolling import DRAIN_S, LOAD, Deployment, Load, at_drain, rollout, save, summary
from vllm_intel.patches.drain_deadline import RefuseWhileDraining

BARE = os.environ.get("INTEL_VLLM_ROLLING_BARE") == "1"
# One client of each kind and no long streams: the witnesses give each drain its work, and the
# lighter load lets a restarted replica start sooner than beside LOAD's six clients (docs/bench.md,
# "rolling restart: the test").
TEST_LOAD = dict(LOAD, streams=1, shorts=1, longs=0)
# The LB's DRAIN step before each `docker stop`: the time a replica's first witnesses have to
# reach it before its SIGTERM can.
TEST_LB_DRAIN_S = 3


@pytest.fixture(scope="module")
def lb_image(docker_host) -> str:
    out, took = build_image("lb")
    if out.returncode != 0:
        pytest.fail(f"build-image.sh lb failed:\n{out.stderr[-4000:]}")
    print(f"built vllm-intel:lb in {took:.0f} s")
    return "vllm-intel:lb"


@pytest.mark.docker
@pytest.mark.slow
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
        # warm_s: a few steady requests to print beside the restart's (the bench measures them)
        result = rollout(dep, warm_s=5, after_s=5, **TEST_LOAD)
    finally:
        dep.down()
    save(result, dep.log_dir / f"{dep.name}.json")
    print(f"\ncompose up --wait {up:.0f} s; whole test {time.monotonic() - t:.0f} s")
    print(result["restart_output"])
    print(summary(result))

    assert result["restart_exit"] == 0, result["restart_output"]
    assert result["restart_output"].count("replaced in") == 2, "both replicas restarted"
    # The load ran through the whole restart, and each replica's drain had work to do: a witness
    # in flight when it began, which it finished (tests/harness/rolling.py, at_drain).
    assert result["during_restart"] >= 10 and result["streams"] >= 10 and result["shorts"] >= 10
    if not BARE:
        at_drain = result["witnesses_at_drain"]
        assert len(at_drain) == 2 and all(at_drain), summary(result)
    assert result["hung"] == 0, summary(result)
    assert result["failed"] == 0, summary(result)


class Replica(http.server.BaseHTTPRequestHandler):
    """A replica on 127.0.0.1: streams each completion at TOKEN_S a token; once the server's
    `draining` is set, answers every POST with the drain's 503."""

    TOKEN_S = 0.05

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.server.draining.is_set():
            self.send_response(503)
            self.end_headers()
            self.wfile.write(RefuseWhileDraining.BODY)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        n = body["max_tokens"]
        for i in range(n):
            time.sleep(self.TOKEN_S)
            choice = {"text": "x", "finish_reason": "length" if i == n - 1 else None}
            self.wfile.write(b"data: %s\n\n" % json.dumps({"choices": [choice]}).encode())
        usage = {"choices": [], "usage": {"completion_tokens": n}}
        self.wfile.write(b"data: %s\n\ndata: [DONE]\n\n" % json.dumps(usage).encode())

    def log_message(self, *args):
        pass


def test_witnesses_keep_a_late_drain_in_work():
    """However late a replica's drain begins after its DRAIN step, its witnesses still stream then:
    here it begins after two of them have ended, and one in flight is finished by it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Replica)
    server.draining = threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    # Witnesses of 60 tokens (3 s at TOKEN_S): no stream rate is known, so they get stream_tokens.
    load = Load(url, "m", streams=0, shorts=0, stream_tokens=60, timeout=60)
    exited = threading.Event()
    try:
        load.witness("r", url, exited, max_tokens=1000)
        poll(lambda: sum(r.kind == "witness" for r in load.done) >= 2, 60, "2 witnesses ended")
        server.draining.set()
        assert exited.wait(60), "the witnesses did not stop at the refusal"
    finally:
        reqs = load.stop(timeout=60)
        server.shutdown()
    assert [r for r in reqs if not r.ok] == []
    assert sum(r.kind == "refused" for r in reqs) >= 1
    assert at_drain(reqs, "r"), reqs
