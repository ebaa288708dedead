"""forward: SIGTERM latency from the supervisor to vLLM's API server, with streams in flight.

t0 = just before the SIGTERM to the supervisor; t1 = the SIGTERM delivered to the API server, as
strace (attached to the API server's threads only, signals only) timestamps it. Optionally against another
checkout's entrypoint.py (`--entrypoint PATH`) to compare before/after a change.

  python -m bench.forward [--entrypoint PATH] [--repeat N] [--streams N]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time

from tests.harness import ROOT, Server, Streams, free_port

MODEL = ROOT / "build" / "tiny-llama"


def once(entrypoint: str, streams: int) -> dict:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="fw-", dir="/tmp"))
    port = free_port()
    s = Server(
        [sys.executable, entrypoint, "serve", str(MODEL), "--enforce-eager", "--port", str(port)],
        port,
        tmp / "server.log",
        {"TMPDIR": str(tmp), "INTEL_VLLM_STATE_FILE": str(tmp / "state.json")},
    )
    try:
        s.wait_ready()
        api = json.loads((tmp / "state.json").read_text())["child"]
        load = Streams(s.url, s.model_name(), streams, max_tokens=2000, timeout=120)
        load.wait_flowing(timeout=120)
        trace = tmp / "strace.txt"
        st = subprocess.Popen(
            [
                "strace",
                "-f",
                "-ttt",
                "-e",
                "trace=none",
                "-e",
                "signal=SIGTERM",
                "-o",
                str(trace),
                "-p",
                str(api),
            ],
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # attached
        t0 = time.time()
        s.signal(signal.SIGTERM)
        code = s.wait(60)
        load.join(60)
        st.wait(10)
        m = re.search(r"^(?:\d+ +)?([0-9.]+) --- SIGTERM", trace.read_text(), re.M)
        return {
            "latency_ms": round((float(m.group(1)) - t0) * 1000, 2) if m else None,
            "exit": code,
        }
    finally:
        if s.proc.poll() is None:
            s.kill_all()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entrypoint", default=str(ROOT / "entrypoint.py"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--streams", type=int, default=8)
    a = ap.parse_args()
    runs = [once(a.entrypoint, a.streams) for _ in range(a.repeat)]
    print(json.dumps({"entrypoint": a.entrypoint, "streams": a.streams, "runs": runs}))


if __name__ == "__main__":
    main()
