"""Where the plugin comes from: its source is the top-level patches/, its import name is
vllm_intel.patches, by packaging alone (pyproject.toml's package-dir): a wheel holds it as
vllm_intel/patches/, an editable install of a checkout (scripts/vllm-venv.sh, the test image's
stage) maps the name to the checkout's patches/."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

import vllm_intel.patches
from tests.harness import ROOT
from tests.harness.editable import editable_venv

SOURCE = ROOT / "patches"
MODULES = sorted(p.name for p in SOURCE.glob("*.py"))

# Prints where the plugin came from, in the process and in a spawned child (vLLM's processes load
# the plugin by its name the same way), and which other directories became vllm_intel.* modules.
PROBE = """
import importlib.util, json, multiprocessing, sys

def where():
    import vllm_intel.patches.registry
    return vllm_intel.patches.registry.__file__

if __name__ == "__main__":
    import vllm_intel.patches
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        child = pool.apply(where)
    print(json.dumps({
        "init": vllm_intel.patches.__file__,
        "registry": where(),
        "child": child,
        "others": [n for n in ("vllm_intel.tests", "vllm_intel.tools", "vllm_intel.docker")
                   if importlib.util.find_spec(n) is not None],
    }))
"""


def probe(cwd: pathlib.Path, pythonpath: pathlib.Path | None, python=sys.executable) -> dict:
    """The probe in `cwd` under `python`, with `pythonpath` alone on PYTHONPATH (None: none)."""
    (cwd / "probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run(
        [str(python), "probe.py"],
        cwd=cwd,
        env=env if pythonpath is None else dict(env, PYTHONPATH=str(pythonpath)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_checkout_imports_the_plugin_from_patches():
    assert not (ROOT / "vllm_intel" / "patches").exists(), "the plugin's source is patches/"
    assert pathlib.Path(vllm_intel.patches.__file__).resolve() == SOURCE / "__init__.py"
    assert [pathlib.Path(p).resolve() for p in vllm_intel.patches.__path__] == [SOURCE]
    from vllm_intel.patches import registry

    assert pathlib.Path(registry.__file__).resolve().parent == SOURCE


def sources(dest: pathlib.Path) -> pathlib.Path:
    """What docker/install-app.sh copies (pyproject.toml, vllm_intel/, patches/), without caches."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    dest.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", dest / "pyproject.toml")
    shutil.copytree(ROOT / "vllm_intel", dest / "vllm_intel", ignore=ignore)
    shutil.copytree(SOURCE, dest / "patches", ignore=ignore)
    return dest


def test_the_venv_maps_the_plugin_to_this_checkout_from_any_cwd(tmp_path):
    """The running venv's editable install of this checkout, nothing on PYTHONPATH, another cwd:
    its vllm_intel.patches is patches/ in the process, a spawned child and `-m`."""
    got = probe(tmp_path, None)
    assert pathlib.Path(got["init"]).resolve() == SOURCE / "__init__.py"
    assert {pathlib.Path(got[k]).resolve() for k in ("registry", "child")} == {
        SOURCE / "registry.py"
    }
    assert got["others"] == []  # exactly vllm_intel.patches, nothing else
    r = subprocess.run(
        [sys.executable, "-m", "vllm_intel.patches", "--help"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (r.returncode, r.stdout.strip()) == (0, vllm_intel.patches.USAGE), r.stderr


def test_an_editable_install_maps_the_plugin_to_the_checkouts_patches(tmp_path):
    """pip's editable install of a checkout (as scripts/vllm-venv.sh and the test image make it),
    here of a copy into a bare venv: setuptools maps vllm_intel.patches to the copy's patches/ in
    the process and a spawned child, and writes into the copy nothing .gitignore keeps."""
    pytest.importorskip("setuptools")
    src = sources(tmp_path / "src")
    before = set(src.rglob("*"))
    python = editable_venv(src, tmp_path / "venv")
    written = {p.relative_to(src).parts[0] for p in set(src.rglob("*")) - before}
    assert written <= {"build", "vllm_intel.egg-info"}, written  # .gitignore: /build/, *.egg-info/
    (tmp_path / "cwd").mkdir()
    got = probe(tmp_path / "cwd", None, python)
    assert got["init"] == str(src / "patches" / "__init__.py")
    assert got["registry"] == got["child"] == str(src / "patches" / "registry.py")
    assert got["others"] == []


def test_the_wheel_holds_vllm_intel_patches_and_never_maps_to_the_checkout(tmp_path):
    """Built from what docker/install-app.sh copies (pyproject.toml, vllm_intel/, patches/), in a
    copy: a stale build/lib of the checkout must not stand in for the package-dir mapping."""
    pytest.importorskip("setuptools")
    src = sources(tmp_path / "src")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["-w", str(tmp_path / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = (tmp_path / "dist").glob("vllm_intel-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = next(z.read(n).decode() for n in names if n.endswith("entry_points.txt"))
        z.extractall(tmp_path / "site")
    plugin = sorted(n.rsplit("/", 1)[1] for n in names if n.startswith("vllm_intel/patches/"))
    assert plugin == MODULES
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"vllm_intel"}, tops  # no patches/
    assert "intel_patches = vllm_intel.patches:register" in entry_points
    # The wheel's files first on sys.path (before the venv's editable install): its own copy.
    (tmp_path / "cwd").mkdir()
    got = probe(tmp_path / "cwd", tmp_path / "site")
    site = tmp_path / "site" / "vllm_intel" / "patches"
    assert got["registry"] == got["child"] == str(site / "registry.py")
    assert got["others"] == []
    # The checkout's entrypoint.py over that install (-S: without this venv's editable one) runs
    # the installed package, never the checkout's vllm_intel/ beside it (no vllm_intel.patches
    # there): `serve` reads the patch names and refuses an unknown one in one line, exit 64.
    (tmp_path / "model").mkdir()
    r = subprocess.run(
        [sys.executable, "-S", str(ROOT / "entrypoint.py"), "serve", str(tmp_path / "model")],
        cwd=tmp_path / "cwd",
        env=dict(
            os.environ,
            PYTHONPATH=str(tmp_path / "site"),
            INTEL_VLLM_PATCHES="nope",
            INTEL_VLLM_STATE_FILE=str(tmp_path / "state.json"),
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 64 and "unknown patch name(s) nope" in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr


def test_a_checkout_without_an_install_says_so_in_one_line(tmp_path):
    """The checkout's entrypoint.py with no install of the project (-S: not this venv's editable
    one): `serve` says what to do in one line, exit 127 (vLLM's processes would look for the
    plugin in vain); subcommands that need no plugin still run from the checkout's files."""
    (tmp_path / "model").mkdir()

    def entrypoint(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-S", str(ROOT / "entrypoint.py"), *args],
            cwd=tmp_path,
            env=dict(os.environ, INTEL_VLLM_STATE_FILE=str(tmp_path / "state.json")),
            capture_output=True,
            text=True,
            timeout=60,
        )

    r = entrypoint("serve", str(tmp_path / "model"))
    assert r.returncode == 127 and r.stdout == "", r
    assert r.stderr.startswith("entrypoint.py: the vllm-intel package is not installed"), r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr
    r = entrypoint("grace-period")
    assert r.returncode == 0 and r.stdout.strip().isdigit(), r


def test_the_images_build_the_wheel_from_patches():
    """The app stage bind-mounts patches/ for docker/install-app.sh, which copies it next to
    pyproject.toml; the test stage's checkout has it too, installed editable as a checkout is."""
    assert '"$src/patches"' in (ROOT / "docker" / "install-app.sh").read_text()
    editable = "--no-deps --no-build-isolation -e"
    assert f'{editable} "$here"' in (ROOT / "scripts" / "vllm-venv.sh").read_text()
    for acc in ("cpu", "xpu"):
        text = (ROOT / "docker" / f"Dockerfile.{acc}").read_text()
        assert "--mount=type=bind,source=patches,target=/tmp/src/patches" in text, acc
        assert "\nCOPY patches /src/patches\n" in text, acc
        assert f"{editable} /src " in text, acc
