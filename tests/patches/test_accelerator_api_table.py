"""Every public torch.accelerator call, enumerated from the installed torch, behaves as
the decision table in cpu_accelerator_api's docstring says - eagerly and inside torch.compile -
on plain torch and with vLLM 0.27.1 / 0.32.0 binders re-run after the plugin."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from _patchtest import run_json

ENUMERATE = r"""
import collections, inspect, json, re, sys, torch
import vllm_intel.patches.cpu_accelerator_api as api
A = torch.accelerator
public = sorted(A.__all__)
doc_rows = sorted(re.findall(r"^\| `(\w+)` \|", api.__doc__, re.M))
table = api.cpu_equivalents()
state = api.PATCH.apply()
VLLM_BINDERS
# Worst case for Dynamo: its name tables keyed on what is bound after vLLM's binders.
from torch._dynamo import trace_rules
from torch._dynamo.variables.torch import TorchInGraphFunctionVariable
trace_rules.clear_lru_cache()
TorchInGraphFunctionVariable._get_handlers.cache_clear()
# argument each call needs (None where the call takes none)
ARGS = {"set_device_index": (0,), "set_device_idx": (0,), "set_stream": (None,)}

def call(name):
    if name == "device_index":
        with A.device_index(0):
            return None
    if name == "Graph":
        return A.Graph()
    return getattr(A, name)(*ARGS.get(name, ()))

def outcome(fn):
    try:
        return ["value", repr(fn())]
    except api.AcceleratorUnavailableError as exc:
        return ["error", str(exc)]
    except Exception as exc:
        # Under torch.compile, when Dynamo keyed its tables on our function, it runs it while
        # tracing and re-raises as TorchRuntimeError quoting our message; accept only that.
        m = re.search(r"torch\.accelerator\.\w+\([^)]*\): no accelerator on this host[^'\"]*",
                      str(exc))
        if m and type(exc).__name__ == "TorchRuntimeError":
            return ["error", m.group(0)]
        return ["other", f"{type(exc).__name__}: {str(exc).splitlines()[0]}"]

results = {}
for name in public:
    def traced(x, name=name):
        return x + 1, call(name)
    eager = outcome(lambda: call(name))
    compiled = {}
    for backend in BACKENDS:
        torch._dynamo.reset()
        r = outcome(lambda: torch.compile(traced, backend=backend)(torch.ones(1))[1])
        compiled[backend] = r
    results[name] = dict(eager=eager, compiled=compiled)
print(json.dumps(dict(public=public, doc_rows=doc_rows, table=sorted(table), state=state,
                      keep=sorted(api._KEEP), results=results)))
"""

BINDERS = {
    "plain": "",
    "0.27.1": "import vllm.v1.worker.cpu.shm\nfrom vllm.v1.worker import cpu_model_runner\n"
    "cpu_model_runner._set_torch_accelerator_to_noop()",
}
BINDERS["0.32.0"] = BINDERS["0.27.1"]

# What each call must give on this CPU-only host (the docstring table, as data).
EXPECTED_VALUE = {
    "is_available": "False",
    "current_accelerator": "None",
    "device_count": "0",
    "synchronize": "None",
    "empty_cache": "None",
    "empty_host_cache": "None",
    "reset_peak_memory_stats": "None",
    "reset_accumulated_memory_stats": "None",
    "memory_allocated": "0",
    "max_memory_allocated": "0",
    "memory_reserved": "0",
    "max_memory_reserved": "0",
    "memory_stats": "OrderedDict()",
}
EXPECTED_ERROR = {
    "get_memory_info",
    "current_device_index",
    "current_device_idx",
    "set_device_index",
    "set_device_idx",
    "get_device_capability",
    "current_stream",
    "set_stream",
    "device_index",
    "Graph",
}


def enumerate_on(where: str, python) -> dict:
    """ENUMERATE's JSON on `where` (plain torch also under inductor, the rest eager only)."""
    backends = ["eager", "inductor"] if where == "plain" else ["eager"]
    code = ENUMERATE.replace("VLLM_BINDERS", BINDERS[where]).replace("BACKENDS", repr(backends))
    return run_json(python, code, timeout=900)


@pytest.fixture(scope="module")
def enumerated(request, vllm_python, default_python):
    """{where: future of enumerate_on(where)} for the cases this session runs, two at a time."""
    wanted = [
        item.callspec.params["where"]
        for item in request.session.items
        if item.module is request.module
        and item.originalname == "test_every_public_call_follows_the_table"
    ]
    with ThreadPoolExecutor(2) as pool:
        yield {
            where: pool.submit(
                enumerate_on, where, default_python if where == "plain" else vllm_python(where)
            )
            for where in wanted
        }


@pytest.mark.parametrize(
    "where",
    [
        "plain",
        pytest.param("0.27.1", marks=pytest.mark.vllm),
        pytest.param("0.32.0", marks=pytest.mark.vllm),
    ],
)
def test_every_public_call_follows_the_table(where, enumerated):
    out = enumerated[where].result()
    assert out["state"] == "applied"
    # The table decides every public name of the installed torch, and only those.
    assert out["doc_rows"] == out["public"], "docstring table vs torch.accelerator.__all__"
    assert out["table"] == out["public"], "cpu_equivalents() vs torch.accelerator.__all__"
    assert (
        sorted(EXPECTED_VALUE) + sorted(EXPECTED_ERROR)
        and sorted([*EXPECTED_VALUE, *EXPECTED_ERROR]) == out["public"]
    ), "test data vs torch"
    for name, res in out["results"].items():
        for mode, got in [
            ("uncompiled", res["eager"]),
            *((f"compiled/{b}", r) for b, r in res["compiled"].items()),
        ]:
            if name == "get_memory_info" and where != "plain":
                # vLLM's CPU worker binds host memory info here on purpose; we leave it.
                assert got[0] == "value" and got[1].startswith("("), (name, mode, got)
            elif name in EXPECTED_VALUE:
                assert got == ["value", EXPECTED_VALUE[name]], (name, mode, got)
            else:
                assert got[0] == "error", (name, mode, got)
                assert (
                    got[1].startswith(f"torch.accelerator.{name}(")
                    and "no accelerator on this host" in got[1]
                ), (name, mode, got)
