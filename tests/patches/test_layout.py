"""Where the plugin comes from: its source is the top-level patches/, its import name is
vllm_intel.patches. In the checkout vllm_intel/__init__.py maps that one name to patches/; a wheel
(pyproject.toml's package-dir) holds it as vllm_intel/patches/ and never takes that mapping."""

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

SOURCE = ROOT / "patches"
MODULES = sorted(p.name for p in SOURCE.glob("*.py"))

# Prints where the plugin came from, in the process and in a spawned child (vLLM's processes load
# the plugin by its name the same way), and whether the checkout's finder is on sys.meta_path.
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
        "finder": any(getattr(f, "__name__", "") == "_SourcePatchesFinder" for f in sys.meta_path),
        "others": [n for n in ("vllm_intel.tests", "vllm_intel.tools", "vllm_intel.docker")
                   if importlib.util.find_spec(n) is not None],
    }))
"""


def probe(cwd: pathlib.Path, pythonpath: pathlib.Path) -> dict:
    (cwd / "probe.py").write_text(PROBE)
    r = subprocess.run(
        [sys.executable, "probe.py"],
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(pythonpath)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_checkout_imports_the_plugin_from_patches():
    assert not (ROOT / "vllm_intel" / "patches").exists(), "the plugin's source is patches/"
    assert pathlib.Path(vllm_intel.patches.__file__) == SOURCE / "__init__.py"
    assert list(vllm_intel.patches.__path__) == [str(SOURCE)]
    from vllm_intel.patches import registry

    assert pathlib.Path(registry.__file__).parent == SOURCE


def test_from_another_cwd_with_the_checkout_on_pythonpath(tmp_path):
    got = probe(tmp_path, ROOT)
    assert got["init"] == str(SOURCE / "__init__.py")
    assert got["registry"] == got["child"] == str(SOURCE / "registry.py")
    assert got["finder"] and got["others"] == []  # exactly vllm_intel.patches, nothing else
    r = subprocess.run(
        [sys.executable, "-m", "vllm_intel.patches", "--help"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (r.returncode, r.stdout.strip()) == (0, vllm_intel.patches.USAGE), r.stderr


def test_a_leftover_pycache_of_the_old_layout_does_not_hide_patches(tmp_path):
    """A checkout pulled over the old layout keeps an untracked vllm_intel/patches/__pycache__:
    the finder comes before the namespace package that directory would otherwise be."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "vllm_intel", src / "vllm_intel", ignore=ignore)
    shutil.copytree(SOURCE, src / "patches", ignore=ignore)
    (src / "vllm_intel" / "patches" / "__pycache__").mkdir(parents=True)
    (tmp_path / "cwd").mkdir()
    got = probe(tmp_path / "cwd", src)
    assert got["registry"] == got["child"] == str(src / "patches" / "registry.py")


def test_the_wheel_holds_vllm_intel_patches_and_never_maps_to_the_checkout(tmp_path):
    """Built from what docker/install-app.sh copies (pyproject.toml, vllm_intel/, patches/), in a
    copy: a stale build/lib of the checkout must not stand in for the package-dir mapping."""
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    src.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", src / "pyproject.toml")
    shutil.copytree(ROOT / "vllm_intel", src / "vllm_intel", ignore=ignore)
    shutil.copytree(SOURCE, src / "patches", ignore=ignore)
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
    # Installed (the wheel's files on sys.path, this checkout nowhere): its own copy, no finder.
    (tmp_path / "cwd").mkdir()
    got = probe(tmp_path / "cwd", tmp_path / "site")
    site = tmp_path / "site" / "vllm_intel" / "patches"
    assert got["registry"] == got["child"] == str(site / "registry.py")
    assert not got["finder"] and got["others"] == []


def test_the_images_build_the_wheel_from_patches():
    """The app stage bind-mounts patches/ for docker/install-app.sh, which copies it next to
    pyproject.toml; the test stage's checkout has it too."""
    assert '"$src/patches"' in (ROOT / "docker" / "install-app.sh").read_text()
    for acc in ("cpu", "xpu"):
        text = (ROOT / "docker" / f"Dockerfile.{acc}").read_text()
        assert "--mount=type=bind,source=patches,target=/tmp/src/patches" in text, acc
        assert "\nCOPY patches /src/patches\n" in text, acc
