"""A container's memory as the kernel counts it for an OOM kill, read on the host, and a burst of
completions to load it. Shared by bench/memory.py and tests/container/test_real_shape.py.

Resident = anonymous + shared memory (cgroup v2 `anon + shmem`; v1 `total_rss + total_shmem`):
what the kernel cannot drop to make room. Page cache (the weights' files read through) is left
out: the kernel reclaims it before it kills.
"""

from __future__ import annotations

import pathlib
import threading

import requests

from tests.harness import docker

CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")
SAMPLE_S = 0.2


def stat_path(name: str) -> pathlib.Path:
    """The container's memory.stat on the host (cgroup v2, else v1's memory controller)."""
    pid = docker("inspect", "-f", "{{.State.Pid}}", name).stdout.strip()
    for line in pathlib.Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "" and (CGROUP_ROOT / "cgroup.controllers").exists():
            return CGROUP_ROOT / path.lstrip("/") / "memory.stat"
        if "memory" in controllers.split(","):
            return CGROUP_ROOT / "memory" / path.lstrip("/") / "memory.stat"
    raise RuntimeError(f"{name}: no memory cgroup")


def resident(path: pathlib.Path) -> int | None:
    try:
        got = dict(line.split() for line in path.read_text().splitlines())
    except (OSError, ValueError):
        return None  # the container is gone
    if "anon" in got:
        return int(got["anon"]) + int(got.get("shmem", 0))
    return int(got.get("total_rss", 0)) + int(got.get("total_shmem", 0))


class Sampler(threading.Thread):
    """Peak of a running container's resident memory, read every SAMPLE_S until `done` is set;
    `phase` names what the peak happened during."""

    def __init__(self, name: str):
        super().__init__(daemon=True)
        self.peak = 0
        self.peak_at = "start"
        self.phase = "start"
        self.done = threading.Event()
        self.path = stat_path(name)

    def run(self) -> None:
        while not self.done.wait(SAMPLE_S):
            now = resident(self.path)
            if now is not None and now > self.peak:
                self.peak, self.peak_at = now, self.phase

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.join()


def burst(url: str, model: str, n: int, prompt: int, out: int) -> int:
    """n completions at once (prompts of `prompt` token ids, `out` tokens each); how many came back
    200 with every token."""
    ok = []

    def one(i: int) -> None:
        ids = [(100 + 7 * i + j) % 30000 + 100 for j in range(prompt)]
        r = requests.post(
            url + "/v1/completions",
            timeout=900,
            json={"model": model, "prompt": ids, "max_tokens": out, "ignore_eos": True},
        )
        if r.status_code == 200 and r.json()["usage"]["completion_tokens"] == out:
            ok.append(i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(ok)
