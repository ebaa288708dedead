"""Each patch's record (patches/tested_code.py) holds the releases it was tested on and its targets'
fingerprints there; its range (``Patch.tested``) and the releases its tests run derive from it. On
code no recorded release has, in the range or outside it, a patch is ``untested`` and not applied,
unless INTEL_VLLM_PATCHES_UNTESTED=1. Process-lifecycle patches apply anyway (their reason says
so)."""

from __future__ import annotations

import importlib
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from _patchtest import run_json, run_py
from test_framework import Fake

import vllm_intel.patches as vip
from tests.harness import ROOT
from tests.harness.patch_states import expected_state, recorded_releases, unrecorded
from vllm_intel.patches import _base, _release_gate, registry
from vllm_intel.patches.tested_code import TESTED

LIFECYCLE = {p.name for p in vip.declarations() if p.lifecycle}
# The releases the project follows, each one the suite can run a patch on: a venv (0.27.1, 0.32.0),
# the sources under a simulated XPU (0.24.0) or on the default venv (0.33.0, 0.34.0).
KNOWN = ("0.24.0", "0.27.1", "0.32.0", "0.33.0", "0.34.0")


@pytest.fixture
def ranged(monkeypatch):
    """Fake patches recorded on 1.0 and 2.0 (no targets: the range decides), the registry made of
    them, and a settable version."""
    good = Fake("good")
    life = Fake("life")
    life.lifecycle = True
    plain = Fake("plain")  # nothing recorded
    for name in ("good", "life"):
        monkeypatch.setitem(TESTED, name, {"1.0": {}, "2.0": {}})
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
    got = _release_gate.outside(version, tested)
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


def test_every_patch_is_recorded_on_releases_the_suite_runs():
    # a record for each, on releases the suite can run (its tests parametrize over them)
    assert unrecorded(registry.all_patches(), KNOWN) == []
    for mod in registry.modules():
        module = importlib.import_module(f"vllm_intel.patches.{mod}")
        p = module.PATCH
        assert p.tested == _release_gate.tested_range(recorded_releases(p.name)), mod
        assert f"``{p.tested}``" in module.__doc__, (mod, "docstring names the range")
        # the docstring says it is a lifecycle patch exactly when it declares it
        assert ("(``lifecycle``)" in module.__doc__) == p.lifecycle, (mod, "docstring: lifecycle")


def test_a_patch_without_a_record_or_on_a_release_not_run_is_reported(monkeypatch):
    p = Fake("demo")
    monkeypatch.setitem(TESTED, "demo", {"0.27.1": {}, "0.32.0": {}})
    assert p.tested == ">=0.27.1,<=0.32.0" and recorded_releases("demo") == ("0.27.1", "0.32.0")
    assert unrecorded([p], KNOWN) == []
    monkeypatch.setitem(TESTED, "demo", {"0.32.0": {}, "0.99.0": {}})
    assert unrecorded([p], KNOWN) == [
        "demo: recorded ['0.32.0', '0.99.0'], the suite runs " + str(sorted(KNOWN))
    ]
    assert unrecorded([Fake("new")], KNOWN)[0].startswith("new: recorded []")


# Any installed code is a target to the gate (its source is read, not run); a stdlib one costs no
# import of vLLM.
TARGET = "json.decoder:JSONDecoder.decode"


@pytest.mark.parametrize("code", ["tested", "changed"])
def test_in_the_range_the_fingerprints_decide(ranged, monkeypatch, code):
    """A release in the range whose target is not a recorded release's code is untested, and the
    reason names the target; with the recorded code it applies as ever."""
    patches, version = ranged
    version["v"] = "1.0+cpu"
    p = patches["good"]
    p.targets = (TARGET,)
    fp = _release_gate.fingerprints([TARGET])[TARGET] if code == "tested" else "0" * 16
    monkeypatch.setitem(TESTED, "good", {"1.0": {TARGET: fp}, "2.0": {TARGET: fp}})
    if code == "tested":
        assert p.apply() == "applied" and p.reason == "good verdict"
        return
    assert p.apply() == "untested" and p.applies == 0 and p.target.attr == "orig"
    assert p.reason == (
        f"vLLM 1.0 is in the tested range >=1.0,<=2.0, not its code; changed since 1.0: {TARGET} "
        "(INTEL_VLLM_PATCHES_UNTESTED=1 applies it anyway)"
    )
    p.revert()
    assert p.apply(allow_untested=True) == "applied"
    assert p.reason.endswith(
        "(untested: vLLM 1.0 is in the tested range >=1.0,<=2.0, "
        f"not its code; changed since 1.0: {TARGET}; "
        "INTEL_VLLM_PATCHES_UNTESTED=1)"
    )


@pytest.mark.parametrize("text", ["recorded", "other"])
def test_a_module_whose_text_is_a_recorded_releases_is_its_code_without_parsing(monkeypatch, text):
    """The gate hashes the target's module first (tested_code.SOURCES): the recorded text is that
    release's code, fingerprints unread; any other text leaves the fingerprints to decide."""
    from vllm_intel.patches import tested_code
    from vllm_intel.patches._code_shape import module_source, source_digest

    digest = source_digest(module_source("json.decoder")) if text == "recorded" else "0" * 16
    monkeypatch.setattr(tested_code, "SOURCES", {"1.0": {"json.decoder": digest}})
    parsed = []
    real = _release_gate.fingerprints
    monkeypatch.setattr(_release_gate, "fingerprints", lambda ts: parsed.append(ts) or real(ts))
    record = {"1.0": {TARGET: "f" * 16}}  # a fingerprint no code has: only the text can match
    got = _release_gate.matching_release(record, [TARGET])
    if text == "recorded":
        assert got == ("1.0", []) and parsed == [], (got, parsed)
    else:
        assert got == (None, [TARGET]) and parsed == [[TARGET]], (got, parsed)


def test_every_recorded_release_has_the_text_of_every_module_it_records():
    from vllm_intel.patches.tested_code import SOURCES

    for name, rows in TESTED.items():
        for release, fps in rows.items():
            modules = {t.partition(":")[0] for t in fps}
            assert modules <= SOURCES.get(release, {}).keys(), (name, release)


VERDICTS = json.loads((ROOT / "docs" / "patch-verdicts.json").read_text())


@pytest.mark.parametrize("release", VERDICTS["releases"])
def test_the_declarations_predict_the_recorded_verdicts(release):
    """docs/patch-verdicts.json: each patch's check() on the release's source, on a CPU host where
    every condition holds. What ``fixed_in``, ``platform``, ``tested`` and ``lifecycle`` predict
    is what was found; outside a range tested code decides (applied or untested)."""
    recorded = VERDICTS["verdicts"][release]
    assert set(recorded) == set(vip.patch_names())
    for p in vip.declarations():
        state = recorded[p.name][0]
        predicted = expected_state(p, release, "cpu", decided=True)
        assert state in ((predicted,) if predicted else ("applied", "untested")), (p.name, state)


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
from vllm_intel.patches.tested_code import SOURCES, TESTED
if {changed}:  # ... or with every target changed since the tested releases (and its module's text)
    SOURCES.clear()
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


BUSY = {"VLLM_SHM_BROADCAST_BUSY_SLEEP_S": "0.0001"}
OPTED_IN = {**BUSY, registry.UNTESTED_ENV: "1"}


@pytest.fixture(scope="module")
def cli(default_python):
    """{(script, opted in): future of its cli_states}: the CLI as is, as if on a newer release
    with the tested code, and with every target changed; two processes at a time."""
    runs = {
        ("tested", False): (CLI, BUSY),
        ("tested", True): (CLI, OPTED_IN),
        ("changed", False): (CLI_AS_IF.format(changed=True), BUSY),
        ("changed", True): (CLI_AS_IF.format(changed=True), OPTED_IN),
        ("same code", False): (CLI_AS_IF.format(changed=False), BUSY),
    }
    with ThreadPoolExecutor(2) as pool:
        yield {k: pool.submit(cli_states, default_python, *v) for k, v in runs.items()}


@pytest.mark.parametrize("opt_in", [False, True])
def test_cli_on_a_release_whose_code_changed(cli, opt_in):
    rows = cli["changed", opt_in].result()
    # Opted in, each patch decides as on the tested release it runs on: applied or upstream, or
    # not-applicable where the hardware says so (cpu-amx-tiles on a CPU without AMX tiles).
    tested = cli["tested", opt_in].result()
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
    assert set(rows) == set(TESTED)


def test_cli_on_a_newer_release_with_the_tested_code(cli):
    """Outside every range, the targets' code is 0.32.0's: each patch decides as it does on
    0.32.0, its reason says why it applies there."""
    rows = cli["same code", False].result()
    tested = cli["tested", False].result()
    for name, line in rows.items():
        assert line.split()[1] == tested[name].split()[1], (line, tested[name])
        if line.split()[1] == "applied":
            assert "vLLM 0.99.0+cpu: its code is 0.3" in line or name in LIFECYCLE, line
