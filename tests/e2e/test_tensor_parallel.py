"""Tensor parallel on CPU, as docs/deploy.md offers it: `serve MODEL --tensor-parallel-size 2` on
this host (one NUMA node, where vLLM's automatic binding refuses two ranks: "Not enough allowed
NUMA nodes to bind threads of 2 local CPUWorkers"). The plan binds each rank's threads itself; the
server serves, drains the streams in flight, leaves no process, no shared memory (the TP
communicator's `vllm_dist_*cpushm_*` segments included) and no run directory: nothing a next
server on the same host could meet."""

from __future__ import annotations

import pathlib
import re
import signal

import pytest
import torch

from tests.harness import Streams

from .conftest import assert_nothing_left

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
SHM = pathlib.Path("/dev/shm")
TP = ("--tensor-parallel-size", "2", "--enforce-eager", "--max-model-len", "512")
TOKENS = 400
# vLLM's shared-memory communicator is in its AVX-512 kernels only (vllm/platforms/cpu.py,
# import_kernels: its AVX2 library has none): on a CPU without AVX-512 the ranks talk through
# torch.distributed, and no `vllm_dist_*` segment exists to be left behind.
SHM_COMMUNICATOR = torch.cpu._is_avx512_supported()


def communicator_segments() -> set[str]:
    return {p.name for p in SHM.iterdir() if p.name.startswith("vllm_dist_")}


def test_tp2_on_one_numa_node_serves_drains_and_leaves_nothing(serve):
    before = communicator_segments()
    s = serve(*TP, drain=60)
    plan = re.search(r"VLLM_CPU_OMP_THREADS_BIND=(\S+)", s.text())
    assert plan and plan.group(1).count("|") == 1, s.tail()  # one CPU list per rank
    made = communicator_segments() - before
    if SHM_COMMUNICATOR:
        assert made, "no TP communicator segment in /dev/shm: the leftover check proves nothing"
    streams = Streams(s.url, s.model, n=4, max_tokens=TOKENS)
    streams.wait_running(s.url, timeout=120)
    s.signal(signal.SIGTERM)
    results = streams.join()
    assert s.wait(timeout=90) == 0, s.tail()
    assert [r.done and r.finish_reason == "length" and r.tokens == TOKENS for r in results] == [
        True
    ] * 4, results
    assert_nothing_left(s)
    assert communicator_segments() <= before, communicator_segments() - before
