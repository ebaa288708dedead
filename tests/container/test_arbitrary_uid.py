"""The CPU image run as an arbitrary uid in group 0, as OpenShift's restricted SCC runs images:
it serves, writes what vLLM writes at run time into HOME's cache (group 0, the owner's rights),
and a `docker stop` with a stream in flight drains it and exits 0."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.harness import Container, Streams, docker
from vllm_intel.supervisor import timing

pytestmark = [pytest.mark.docker, pytest.mark.slow]
UID = 12345  # no entry in the image's /etc/passwd


def test_an_arbitrary_uid_in_group_0_serves_drains_and_stops(cpu_image):
    name = f"vllm-intel-uid-{uuid.uuid4().hex[:8]}"
    args = ["--user", f"{UID}:0", "--shm-size", "1g"]
    with Container(name, cpu_image(), args, ["serve", "--enforce-eager"]) as c:
        c.wait_ready(300)
        assert docker("exec", name, "id", "-u").stdout.strip() == str(UID)
        # What this uid wrote under HOME's cache (vLLM's model info, the compile cache dirs).
        mine = docker(
            "exec", name, "find", "/home/vllm/.cache", "-uid", str(UID), "-print"
        ).stdout.split()
        assert mine, docker("exec", name, "ls", "-laR", "/home/vllm/.cache").stdout
        model = "/opt/vllm-intel/models/tiny-llama"
        streams = Streams(c.url, model, n=2, max_tokens=1500, timeout=120)
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
