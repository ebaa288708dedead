"""A new patch is one module, one test and its record. Added to a copy of the checkout (its record
as `tools/upstream_release.py record --add noop-demo 0.27.1 0.32.0` writes it for a patch without
targets), a trivial patch is found by the registry, put in its declared place in the apply order,
named by the supervisor's settings and in the generated tables of the README and docs/patches.md,
and given its expected state and tested releases, all by the real code and with no other file
written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import vllm_intel.patches as vip
from tests.conftest import upstream_release
from tests.harness import ROOT
from tests.harness.patch_states import serve_expectations
from vllm_intel.patches.tested_code import TESTED

MODULE = '''"""noop-demo: changes nothing (the patch tests/patches/test_new_patch.py adds).

Target:   none.
Upstream: none.
Releases: every release.
Tested:   vLLM ``>=0.27.1,<=0.32.0`` (its record): tests/patches/test_noop_demo.py.
"""

from __future__ import annotations

from ._base import NEEDED, Patch


class NoopDemo(Patch):
    name = "noop-demo"
    order = 55
    summary = "nothing: the trivial patch of test_new_patch.py"

    def check(self) -> tuple[str, str]:
        return NEEDED, "always"

    def _apply(self) -> None:
        return None


PATCH = NoopDemo()
'''

TEST = '''"""noop-demo: applied, then reverted."""

from vllm_intel.patches.noop_demo import PATCH


def test_applies_and_reverts():
    assert PATCH.apply() == "applied"
    PATCH.revert()
    assert PATCH.state == "pending"
'''

# Run in the copy, by its own code: what the registry, the supervisor and the docs make of it.
PROBE = """
import dataclasses, json, pathlib, runpy, sys
import vllm_intel.patches as plugin
from vllm_intel.patches import registry
from vllm_intel.patches._release_gate import recorded
from vllm_intel.supervisor import docs, settings

def refused(name):
    try:
        settings.check_patches({"INTEL_VLLM_PATCHES": name})  # the supervisor's check of names
    except Exception:
        return True
    return False


root = pathlib.Path.cwd()
test = runpy.run_path(str(root / "tests/patches/test_noop_demo.py"))
test["test_applies_and_reverts"]()
print(json.dumps({
    "files": [m.__file__ for m in (plugin, registry, docs, settings)],
    "modules": registry.modules(),
    "names": plugin.patch_names(),
    "refused": [n for n in ("noop-demo", "no-such-patch") if refused(n)],
    "declarations": [dataclasses.asdict(d) for d in plugin.declarations()],
    "recorded": list(recorded("noop-demo")),
    "readme": docs.render((root / "README.md").read_text()),
    "page": docs.render((root / "docs/patches.md").read_text()),
    "torch": "torch" in sys.modules,
}))
"""


def copy_checkout(root):
    """What the registry, the settings and the docs read: the plugin laid out as a wheel holds it
    (vllm_intel/patches/ is patches/), the docs and the patch tests' sources."""
    top = str(ROOT / "vllm_intel")
    skip = lambda d, names: [
        n for n in names if n == "__pycache__" or (d == top and n == "patches")
    ]
    shutil.copytree(ROOT / "patches", root / "patches", ignore=skip)
    shutil.copytree(ROOT / "vllm_intel", root / "vllm_intel", ignore=skip)
    (root / "vllm_intel" / "patches").symlink_to("../patches", target_is_directory=True)
    (root / "docs").mkdir()
    for name in ("README.md", "docs/patches.md", "docs/patch-verdicts.json"):
        shutil.copy(ROOT / name, root / name)
    (root / "tests" / "patches").mkdir(parents=True)
    for test in (ROOT / "tests" / "patches").glob("test_*.py"):
        shutil.copy(test, root / "tests" / "patches" / test.name)


def snapshot(root) -> dict[str, bytes]:
    """Every file under root (a symlinked directory once, where it is)."""
    out = {}
    for where, _, files in os.walk(root):
        for name in files:
            path = os.path.join(where, name)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, root)] = fh.read()
    return out


def written(before: dict, after: dict) -> set[str]:
    return {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}


def probe(root) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    cp = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=root, env=env, capture_output=True, text=True
    )
    assert cp.returncode == 0, cp.stderr[-3000:]
    return json.loads(cp.stdout.splitlines()[-1])


def test_a_new_patch_is_its_module_and_its_test(tmp_path):
    root = tmp_path / "checkout"
    copy_checkout(root)
    before = snapshot(root)
    (root / "patches" / "noop_demo.py").write_text(MODULE)
    (root / "tests" / "patches" / "test_noop_demo.py").write_text(TEST)
    record = {**TESTED, "noop-demo": {"0.27.1": {}, "0.32.0": {}}}
    (root / "patches" / "tested_code.py").write_text(upstream_release().render_record(record))
    added = snapshot(root)
    assert written(before, added) == {
        "patches/noop_demo.py",
        "tests/patches/test_noop_demo.py",
        "patches/tested_code.py",
    }

    got = probe(root)
    assert written(added, snapshot(root)) == set()  # the code above wrote nothing
    assert all(f.startswith(f"{root}/") for f in got["files"]), got["files"]
    assert got["torch"] is False
    # found, and applied in its declared place: after the patches of a smaller order
    real = vip.declarations()
    at = sum(d.order < 55 for d in real)
    modules, names = [d.module for d in real], [d.name for d in real]
    assert got["modules"] == [*modules[:at], "noop_demo", *modules[at:]]
    assert got["names"] == [*names[:at], "noop-demo", *names[at:]]
    assert got["refused"] == ["no-such-patch"]  # the supervisor's check knows the new name
    # in the README's verdict table (none recorded yet) and in docs/patches.md's declarations
    summary = "nothing: the trivial patch of test_new_patch.py"
    releases = json.loads((ROOT / "docs" / "patch-verdicts.json").read_text())["releases"]
    assert f"| `noop-demo` | {summary} |" + " not recorded |" * len(releases) in got["readme"]
    assert f"| `noop-demo` | {summary} |" in got["page"]
    assert (
        "| `noop-demo` | `patches/noop_demo.py` | 55 | `>=0.27.1,<=0.32.0` | 0.27.1, 0.32.0 "
        "| none | any | - |"
    ) in got["page"]
    # its expected state in a CPU `vllm serve`, and its range against what its test runs
    declared = [vip.Declared(**{**d, "targets": tuple(d["targets"])}) for d in got["declarations"]]
    assert [d for d in declared if d not in real] == [declared[at]]
    assert (declared[at].name, declared[at].tested) == ("noop-demo", ">=0.27.1,<=0.32.0")
    for release in ("0.27.1", "0.32.0"):
        assert serve_expectations(declared, release)["noop-demo"] == "applied"
    assert got["recorded"] == ["0.27.1", "0.32.0"]  # the releases its tests run it on
