"""Each patch declares the vLLM releases it was tested on (``Patch.tested``, a PEP 440
specifier); outside that range it is ``untested`` and not applied, unless
INTEL_VLLM_PATCHES_UNTESTED=1. Process-lifecycle patches apply anyway (their reason says so)."""

from __future__ import annotations

import importlib
import logging
import os

import pytest
from _patchtest import run_json, run_py
from packaging.specifiers import SpecifierSet
from test_framework import Fake

import vllm_intel.patches as vip
from vllm_intel.patches import _base, registry

LIFECYCLE = {"fast-exit", "engine-parent-watch"}
KNOWN = ("0.24.0", "0.27.1", "0.32.0", "0.33.0", "0.34.0")  # the releases the project follows
# What the suite runs each patch on (see each patch's tests): the ranges must cover exactly these.
EXERCISED = {
    "cpu-accelerator-api": ("0.27.1", "0.32.0"),
    "cpu-accelerator-noops": ("0.27.1", "0.32.0"),
    "xpu-shutdown": ("0.24.0", "0.27.1", "0.32.0"),  # 0.24.0: the real sources, simulated XPU
    "drain-deadline": ("0.27.1", "0.32.0"),
    "fast-exit": ("0.27.1", "0.32.0"),
    "cpu-aot-compile": ("0.27.1", "0.32.0", "0.33.0", "0.34.0"),  # 0.33/0.34: sdist sources
    "shm-busy-sleep": ("0.27.1", "0.32.0", "0.33.0", "0.34.0"),
    "engine-parent-watch": ("0.27.1", "0.32.0"),
    "cpu-amx-tiles": ("0.27.1", "0.32.0"),
}


@pytest.fixture
def ranged(monkeypatch):
    """Fake patches with a tested range, the registry made of them, and a settable version."""
    good = Fake("good")
    good.tested = ">=1.0,<=2.0"
    life = Fake("life")
    life.tested, life.lifecycle = ">=1.0,<=2.0", True
    plain = Fake("plain")  # no range declared
    ps = [good, life, plain]
    monkeypatch.setattr(registry, "all_patches", lambda: ps)
    monkeypatch.setattr(vip, "_registered_pid", None)
    for k in (registry.ALLOW_ENV, registry.DENY_ENV, registry.STRICT_ENV, registry.UNTESTED_ENV):
        monkeypatch.delenv(k, raising=False)
    version = {"v": "1.5"}
    monkeypatch.setattr(_base, "vllm_version", lambda: version["v"])
    return {p.name: p for p in ps}, version


@pytest.mark.parametrize(
    "version,tested,out",
    [
        ("0.32.0", ">=0.27.1,<=0.32.0", None),
        ("0.32.0+cpu", ">=0.27.1,<=0.32.0", None),  # the local suffix is dropped
        ("0.27.1+xpu", ">=0.27.1,<=0.32.0", None),
        ("0.24.0+cpu", ">=0.27.1,<=0.32.0", "vLLM 0.24.0 is outside the tested range"),
        ("0.33.0", ">=0.27.1,<=0.32.0", "vLLM 0.33.0 is outside the tested range"),
        ("0.32.1.dev3+g1234", ">=0.27.1,<=0.32.0", "vLLM 0.32.1.dev3 is outside"),
        ("unknown", ">=0.27.1,<=0.32.0", "vLLM unknown (not a PEP 440 version) is outside"),
    ],
)
def test_outside(version, tested, out):
    got = _base.outside(version, tested)
    assert got == out if out is None else got.startswith(out) and got.endswith(tested)


def test_in_range_applies_as_before(ranged):
    patches, _ = ranged
    assert patches["good"].apply() == "applied"
    assert patches["good"].status() == ("good", "applied", "good verdict")


def test_outside_the_range_is_untested_and_not_applied(ranged):
    patches, version = ranged
    version["v"] = "2.1+cpu"
    p = patches["good"]
    assert p.apply() == "untested" and p.apply() == "untested"
    assert p.applies == 0 and p.target.attr == "orig"
    assert p.status() == (
        "good",
        "untested",
        "vLLM 2.1 is outside the tested range >=1.0,<=2.0 "
        "(INTEL_VLLM_PATCHES_UNTESTED=1 applies it anyway)",
    )
    assert patches["plain"].apply() == "applied"  # no range declared: nothing to compare


def test_outside_the_range_with_the_opt_in_applies(ranged, monkeypatch):
    patches, version = ranged
    version["v"] = "2.1"
    p = patches["good"]
    assert p.apply(allow_untested=True) == "applied" and p.applies == 1
    assert p.reason == (
        "good verdict (untested: vLLM 2.1 is outside the tested range >=1.0,<=2.0; "
        "INTEL_VLLM_PATCHES_UNTESTED=1)"
    )
    p.revert()
    assert p.target.attr == "orig"
    monkeypatch.setenv(registry.UNTESTED_ENV, "1")  # apply() without an argument reads it
    assert p.apply() == "applied" and p.applies == 2
    monkeypatch.setenv(registry.UNTESTED_ENV, "0")
    p.revert()
    assert p.apply() == "untested"


def test_lifecycle_patches_apply_outside_their_range(ranged):
    patches, version = ranged
    version["v"] = "0.5"
    p = patches["life"]
    assert p.apply() == "applied" and p.applies == 1
    assert p.reason == (
        "life verdict (untested: vLLM 0.5 is outside the tested range >=1.0,<=2.0; lifecycle patch)"
    )


def test_without_vllm_the_range_is_not_checked(ranged):
    patches, version = ranged
    version["v"] = None
    assert patches["good"].apply() == "applied" and patches["good"].reason == "good verdict"


def test_status_line_and_table_show_untested(ranged, caplog, capsys):
    patches, version = ranged
    version["v"] = "3.0"
    with caplog.at_level(logging.INFO, logger="vllm.vllm_intel.patches"):
        vip.register()
    lines = [r.getMessage() for r in caplog.records if "patches (pid" in r.getMessage()]
    assert lines[0].endswith(
        f"(pid {os.getpid()}, API server): good=untested life=applied plain=applied"
    )
    for p in patches.values():
        p.revert()
        p.state = "pending"
    assert vip.main([]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in out] == [
        ["good", "untested"],
        ["life", "applied"],
        ["plain", "applied"],
    ]
    assert out[0].endswith(
        "vLLM 3.0 is outside the tested range >=1.0,<=2.0 "
        "(INTEL_VLLM_PATCHES_UNTESTED=1 applies it anyway)"
    )


def test_apply_all_passes_the_opt_in(ranged):
    patches, version = ranged
    version["v"] = "3.0"
    vip.apply_all({registry.UNTESTED_ENV: "1"})
    assert patches["good"].state == "applied"


# -- the real patches ----------------------------------------------------------------------------


def test_every_patch_declares_the_releases_its_tests_run():
    for mod in registry.PATCH_MODULES:
        module = importlib.import_module(f"vllm_intel.patches.{mod}")
        p = module.PATCH
        spec = SpecifierSet(p.tested)  # a valid PEP 440 specifier
        # exactly the followed releases the suite runs it on
        assert {v for v in KNOWN if spec.contains(v)} == set(EXERCISED[p.name]), p.name
        assert p.name in EXERCISED
        assert f"``{p.tested}``" in module.__doc__, (mod, "docstring names the range")
        assert p.lifecycle == (p.name in LIFECYCLE), p.name


def test_version_is_the_imported_vllms(default_python, old_xpu_vllm_source, tmp_path):
    """The vLLM this interpreter imports, not the installed dist: the simulated-XPU tests put the
    0.24.0 sources first on PYTHONPATH, and that is the release the patches then see."""
    code = (
        "import json; from vllm_intel.patches import _base; print(json.dumps(_base.vllm_version()))"
    )
    assert run_json(default_python, code) == "0.32.0"
    assert run_json(default_python, code, env={"PYTHONPATH": str(old_xpu_vllm_source)}) == "0.24.0"
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").touch()
    assert run_json(default_python, code, env={"PYTHONPATH": str(tmp_path)}) == "unknown"


CLI_AS_IF = """
import sys, vllm
vllm.__version__ = "0.99.0+cpu"  # as if this were a newer release, with 0.32.0's code
import vllm_intel.patches as v
from vllm_intel.patches.tested_code import TESTED
if {changed}:  # ... or with every target changed since the tested releases
    for rows in TESTED.values():
        for fps in rows.values():
            fps.update(dict.fromkeys(fps, "0" * 16))
sys.exit(v.main([]))
"""


CLI = """
import sys
import vllm_intel.patches as v
sys.exit(v.main([]))
"""


def cli_states(python, code: str, env: dict) -> dict[str, str]:
    cp = run_py(python, code, env=env)
    assert cp.returncode == 0, cp.stderr[-3000:]
    return {line.split()[0]: line for line in cp.stdout.splitlines()}


@pytest.mark.parametrize("opt_in", [False, True])
def test_cli_on_a_release_whose_code_changed(default_python, opt_in):
    env = {registry.UNTESTED_ENV: "1"} if opt_in else {}
    env["VLLM_SHM_BROADCAST_BUSY_SLEEP_S"] = "0.0001"
    rows = cli_states(default_python, CLI_AS_IF.format(changed=True), env)
    # Opted in, each patch decides as on the tested release it runs on: applied or upstream, or
    # not-applicable where the hardware says so (cpu-amx-tiles on a CPU without AMX tiles).
    tested = cli_states(default_python, CLI, env)
    for name, line in rows.items():
        state, was = line.split()[1], tested[name].split()[1]
        if was in ("upstream", "not-applicable"):  # a verdict that only reads stands anywhere
            assert state == was, (line, tested[name])
        elif name in LIFECYCLE:  # state as always, the reason says it is untested here
            assert state != "untested" and "untested: vLLM 0.99.0" in line, line
        elif opt_in:
            assert state == was == "applied", (line, tested[name])
            assert "(untested: vLLM 0.99.0 is outside the tested range" in line, line
        else:
            assert state == "untested", line
            assert "vLLM 0.99.0 is outside the tested range >=0." in line, line
            assert "; changed since 0.3" in line, line  # names the release and the targets
    assert set(rows) == set(EXERCISED)


def test_cli_on_a_newer_release_with_the_tested_code(default_python):
    """Outside every range, the targets' code is 0.32.0's: each patch decides as it does on
    0.32.0, its reason says why it applies there."""
    env = {"VLLM_SHM_BROADCAST_BUSY_SLEEP_S": "0.0001"}
    rows = cli_states(default_python, CLI_AS_IF.format(changed=False), env)
    tested = cli_states(default_python, CLI, env)
    for name, line in rows.items():
        assert line.split()[1] == tested[name].split()[1], (line, tested[name])
        if line.split()[1] == "applied":
            assert "vLLM 0.99.0+cpu: its code is 0.3" in line or name in LIFECYCLE, line
