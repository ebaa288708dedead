"""A throwaway venv holding a checkout installed editable, as scripts/vllm-venv.sh installs one:
pip's editable install, built by the running python's setuptools (no network, no build
isolation) and installed into a pip-less venv of another python. setuptools then maps
vllm_intel.patches to the checkout's patches/ in every process of that venv."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys


def editable_venv(
    src: pathlib.Path, venv: pathlib.Path, base: str = sys.executable, system_site: bool = False
) -> pathlib.Path:
    """Create `venv` from the python `base` (with its system site-packages if `system_site`),
    install the checkout `src` into it editable; return the venv's python."""
    create = [str(base), "-m", "venv", "--without-pip"]
    subprocess.run(create + ["--system-site-packages"] * system_site + [str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
        + ["--target", site, "-e", str(src)],
        # setuptools' notice about directories named like the package (scripts/vllm-venv.sh)
        env=dict(os.environ, PYTHONWARNINGS="ignore:Editable installation"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return python
