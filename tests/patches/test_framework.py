"""The plugin framework: entry point, registry selection, register() and main() contracts."""

from __future__ import annotations

import importlib.metadata
import logging
import pathlib

import pytest
from _patchtest import run_py

import vllm_intel.patches as vip
from tests.harness import ROOT
from vllm_intel.patches import _base, registry
from vllm_intel.patches.tested_code import TESTED

MINE = ("cpu-accelerator-api", "cpu-accelerator-noops", "xpu-shutdown")


class Fake(_base.Patch):
    """A patch over a plain object, so the protocol is tested without touching torch/vLLM."""

    def __init__(self, name, verdict=_base.NEEDED, boom=False):
        super().__init__()
        self.name, self.verdict, self.boom = name, verdict, boom
        self.target = type("T", (), {"attr": "orig"})
        self.applies = 0

    def check(self):
        return self.verdict, f"{self.name} verdict"

    def _apply(self):
        self.applies += 1
        self._replace(self.target, "attr", "patched")
        self._replace(self.target, "added", 1)
        if self.boom:
            raise RuntimeError("simulated failure\nsecond line")


@pytest.fixture
def fakes(monkeypatch):
    ps = [
        Fake("good"),
        Fake("bad", boom=True),
        Fake("done", _base.UPSTREAM),
        Fake("elsewhere", _base.NOT_APPLICABLE),
    ]
    monkeypatch.setattr(registry, "all_patches", lambda: ps)
    monkeypatch.setattr(vip, "_registered_pid", None)
    for k in (registry.ALLOW_ENV, registry.DENY_ENV, registry.STRICT_ENV):
        monkeypatch.delenv(k, raising=False)
    return {p.name: p for p in ps}


def test_entry_point_is_registered():
    eps = importlib.metadata.entry_points(group="vllm.general_plugins")
    ours = [ep for ep in eps if ep.value == "vllm_intel.patches:register"]
    assert [ep.name for ep in ours] == ["intel_patches"]
    assert ours[0].load() is vip.register


def test_registry_lists_our_modules_with_docstrings():
    names = [p.name for p in registry.all_patches()]
    assert set(MINE) <= set(names) and len(names) == len(set(names))
    for mod in registry.modules():
        doc = importlib.import_module(f"vllm_intel.patches.{mod}").__doc__
        # Every patch names its target, the upstream fix (or that there is none), the releases.
        for word in ("target", "upstream:", "release"):
            assert word in doc.lower(), (mod, word)


def test_every_public_module_is_a_patch_and_declares_itself():
    """A module of patches/ is a patch unless _private (helpers) or the registry's own; each
    declares its name and order in its own class, as literals the registry reads without import."""
    source = pathlib.Path(registry.__file__).parent
    public = sorted(
        p.stem
        for p in source.glob("*.py")
        if not p.stem.startswith("_") and p.stem not in registry.NOT_PATCHES
    )
    assert sorted(registry.modules()) == public and len(public) >= len(MINE)
    declared = registry.declarations()
    patches = registry.all_patches()
    assert [d.name for d in declared] == [p.name for p in patches] == vip.patch_names()
    for d, p in zip(declared, patches, strict=True):
        assert {"name", "order"} <= set(vars(type(p))), d.module
        for attr in registry.DECLARED:  # the source's literals are the object's attributes
            assert getattr(d, attr) == getattr(p, attr), (d.module, attr)
        assert d.tested == p.tested != "", d.module  # the range its record holds
    orders = [d.order for d in declared]
    assert orders == sorted(orders) and len(set(orders)) == len(orders), orders


@pytest.mark.parametrize(
    "body,error",
    [
        ('    name = "x"\n', "X declares no order"),
        ("    order = 1\n", "X declares no name"),
        (
            '    name = "x"\n    order = 1\n    upstream = "#" + "1"\n',
            "X.upstream is not a literal",
        ),
        ('    name = "x"\n    order = 1\n    tested = ">=0.1"\n', r"X.tested is its record's"),
    ],
)
def test_a_declaration_the_registry_cannot_read_is_an_error(tmp_path, body, error):
    module = tmp_path / "some_patch.py"
    module.write_text(f"class X(Patch):\n{body}\n\nPATCH = X()\n")
    with pytest.raises(ValueError, match=f"some_patch.py: {error}"):
        registry.read_declarations(module)
    module.write_text("PATCH = make()\n")
    with pytest.raises(ValueError, match="not an instance of a class defined in its module"):
        registry.read_declarations(module)
    module.write_text("HELPER = 1\n")
    assert registry.read_declarations(module) is None


def test_every_patch_has_its_row_in_the_readme_and_docs():
    for doc in ("README.md", "docs/patches.md"):
        text = (ROOT / doc).read_text()
        for p in registry.all_patches():
            assert f"| `{p.name}` |" in text, (doc, p.name)


def test_apply_is_idempotent_and_revert_restores(fakes):
    p = fakes["good"]
    assert p.apply() == "applied" and p.apply() == "applied"
    assert p.applies == 1 and p.target.attr == "patched" and p.target.added == 1
    p.revert()
    assert p.target.attr == "orig" and not hasattr(p.target, "added")
    assert p.status() == ("good", "pending", "reverted")


def test_failed_apply_is_reported_and_rolled_back(fakes):
    p = fakes["bad"]
    assert p.apply() == "failed"
    assert p.status() == ("bad", "failed", "RuntimeError: simulated failure")
    assert p.target.attr == "orig" and not hasattr(p.target, "added")


class Raises(Fake):
    def check(self):
        raise RuntimeError("unknown shape")


@pytest.mark.parametrize(
    "version,lifecycle,reason",
    [
        ("1.5", False, "RuntimeError: unknown shape"),
        (None, False, "RuntimeError: unknown shape"),
        ("2.1", False, "vLLM 2.1 is outside the tested range >=1.0,<=2.0 (its check failed there)"),
        ("2.1", True, "vLLM 2.1 is outside the tested range >=1.0,<=2.0 (its check failed there)"),
    ],
)
def test_a_check_raising_outside_the_tested_range_is_untested(
    monkeypatch, version, lifecycle, reason
):
    """In the range (or without vLLM) a check that raises is a failure; outside it, opted in or a
    lifecycle patch, the code the patch never met is the news, not the error."""
    p = Raises("shaky")
    p.lifecycle = lifecycle
    monkeypatch.setitem(TESTED, "shaky", {"1.0": {}, "2.0": {}})  # tested on 1.0 and 2.0
    monkeypatch.setattr(_base, "vllm_version", lambda: version)
    state = "untested" if "outside" in reason else "failed"
    assert p.apply(allow_untested=True) == state and p.status() == ("shaky", state, reason)
    assert p.applies == 0


def test_not_needed_changes_nothing(fakes):
    for name, state in (("done", "upstream"), ("elsewhere", "not-applicable")):
        assert fakes[name].apply() == state and fakes[name].applies == 0


@pytest.mark.parametrize(
    "allow,deny,enabled",
    [
        (None, None, ["good", "bad", "done", "elsewhere"]),
        ("good, done", None, ["good", "done"]),
        (None, "bad", ["good", "done", "elsewhere"]),
        ("good,bad", "bad", ["good"]),
    ],
)
def test_selection(fakes, allow, deny, enabled):
    env = {k: v for k, v in ((registry.ALLOW_ENV, allow), (registry.DENY_ENV, deny)) if v}
    on, off, err = registry.select(env)
    assert [p.name for p in on] == enabled and err is None
    assert sorted(p.name for p in off) == sorted(set(fakes) - set(enabled))


def test_unknown_name_is_a_config_error_but_known_names_still_count(fakes):
    on, _, err = registry.select({registry.DENY_ENV: "bad,nosuch"})
    assert isinstance(err, _base.PatchConfigError)
    assert "nosuch" in str(err) and "\n" not in str(err)
    assert "bad" not in [p.name for p in on]


def test_register_logs_one_line_and_never_raises(fakes, caplog, monkeypatch):
    monkeypatch.setenv(registry.DENY_ENV, "elsewhere")
    with caplog.at_level(logging.INFO, logger="vllm.vllm_intel.patches"):
        vip.register()
        vip.register()  # vLLM may call it again in the same process: no second line
    lines = [r.getMessage() for r in caplog.records if "patches (pid" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].endswith(
        "(pid %d, API server): good=applied bad=failed done=upstream "
        "elsewhere=disabled" % __import__("os").getpid()
    )
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["vllm-intel patch bad failed: RuntimeError: simulated failure"]


def test_register_strict_raises_naming_the_patch(fakes, monkeypatch):
    monkeypatch.setenv(registry.STRICT_ENV, "1")
    with pytest.raises(_base.PatchFailedError) as exc:
        vip.register()
    assert str(exc.value) == (
        "vllm-intel patch bad failed: RuntimeError: simulated failure (INTEL_VLLM_PATCHES_STRICT=1)"
    )


def test_register_config_error(fakes, monkeypatch, caplog):
    monkeypatch.setenv(registry.ALLOW_ENV, "good,typo")
    with caplog.at_level(logging.INFO, logger="vllm.vllm_intel.patches"):
        vip.register()  # non-strict: logged once, known names applied
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "typo" in errors[0]
    assert fakes["good"].state == "applied" and fakes["bad"].state == "disabled"
    monkeypatch.setattr(vip, "_registered_pid", None)
    monkeypatch.setenv(registry.STRICT_ENV, "1")
    with pytest.raises(_base.PatchConfigError, match="typo"):
        vip.register()


def test_main_prints_one_line_per_patch(fakes, capsys):
    assert vip.main([]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in out] == [
        ["good", "applied"],
        ["bad", "failed"],
        ["done", "upstream"],
        ["elsewhere", "not-applicable"],
    ]
    assert out[1].endswith("RuntimeError: simulated failure")


def test_main_strict_failure_exit_1(fakes, capsys):
    assert vip.main(["--strict"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "vllm-intel patches: vllm-intel patch bad failed: RuntimeError: simulated "
        "failure (INTEL_VLLM_PATCHES_STRICT=1)"
    ]


def test_process_kind(monkeypatch):
    import multiprocessing

    for name, kind in (
        ("MainProcess", "API server"),
        ("EngineCore", "EngineCore"),
        ("EngineCore_DP1", "EngineCore DP1"),
        ("VllmWorker-0", "Worker"),
    ):
        monkeypatch.setattr(multiprocessing.current_process(), "name", name)
        assert vip.process_kind() == kind


# -- the real CLI, in a subprocess ---------------------------------------------------------------


def test_cli_prints_table(default_python):
    cp = run_py(
        default_python, "import runpy; runpy.run_module('vllm_intel.patches', run_name='__main__')"
    )
    assert cp.returncode == 0, cp.stderr
    rows = {line.split()[0]: line.split()[1] for line in cp.stdout.splitlines()}
    assert {k: rows[k] for k in MINE} == {
        "cpu-accelerator-api": "applied",
        "cpu-accelerator-noops": "upstream",
        "xpu-shutdown": "upstream",
    }


@pytest.mark.parametrize("var", [registry.ALLOW_ENV, registry.DENY_ENV])
def test_cli_unknown_name_exit_64(default_python, var):
    cp = run_py(
        default_python,
        "import sys, vllm_intel.patches as v; sys.exit(v.main([]))",
        env={var: "cpu-accelerator-api,no-such-patch"},
    )
    assert cp.returncode == 64
    assert cp.stdout == ""
    err = [l for l in cp.stderr.splitlines() if l.startswith("vllm-intel")]
    assert len(err) == 1 and "no-such-patch" in err[0] and err[0].startswith("vllm-intel patches:")


def test_cli_strict_with_failing_patch(default_python):
    """A real patch made to fail (its apply raises) -> strict: exit 1, one line naming it."""
    cp = run_py(
        default_python,
        """
import sys, vllm_intel.patches as v
from vllm_intel.patches import cpu_accelerator_api as api
def boom():
    raise OSError("cannot bind")
api.PATCH._apply = boom
sys.exit(v.main([]))
""",
        env={registry.STRICT_ENV: "1"},
    )
    assert cp.returncode == 1
    # (stderr also carries third-party noise, e.g. triton's nanobind leak report at exit)
    assert [l for l in cp.stderr.splitlines() if l.startswith("vllm-intel")] == [
        "vllm-intel patches: vllm-intel patch cpu-accelerator-api failed: OSError: cannot bind "
        "(INTEL_VLLM_PATCHES_STRICT=1)"
    ]
    assert "cpu-accelerator-api    failed" in cp.stdout


def test_cli_bad_argument_exit_64(default_python):
    cp = run_py(
        default_python, "import sys, vllm_intel.patches as v; sys.exit(v.main(['--bogus']))"
    )
    assert cp.returncode == 64
    assert [l for l in cp.stderr.splitlines() if "--bogus" in l] == [
        "vllm-intel patches: unknown argument '--bogus'; usage: python -m vllm_intel.patches [--strict]"
    ]
