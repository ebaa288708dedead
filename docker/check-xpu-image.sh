#!/bin/bash
# The XPU image's `vllm` stage, both routes: fail the build unless the environment is the recipe's
# and loads without a GPU (build machines have none). Each check has a name:
#   torch-xpu     torch is TORCH_VERSION and was built with XPU support
#   device-count  torch.xpu.device_count() answers (0 here) instead of crashing
#   vllm          the installed vLLM is VLLM_VERSION built for XPU (its metadata says X+xpu; its
#                 __version__ is the plain X, as setuptools-scm writes it before setup.py adds the
#                 suffix) and is the one in /opt/venv, not a source tree
#   xpu-kernels   vllm_xpu_kernels is XPU_KERNELS_VERSION and its _C extension loads (libsycl found
#                 through LD_LIBRARY_PATH)
#   level-zero    level_zero/ze_api.h is where Triton's launcher build looks (/usr/include, CPATH,
#                 C_INCLUDE_PATH)
# A stand-in of upstream's image (the tests' only: no registry, no GPU) names in
# /etc/vllm-intel/stand-in the checks it cannot pass; those print "stand-in: NAME ..." and count
# as neither passed nor failed. Every other check fails the build.
#
# Env: VLLM_VERSION, TORCH_VERSION, XPU_KERNELS_VERSION.
set -euo pipefail
: "${VLLM_VERSION:?}" "${TORCH_VERSION:?}" "${XPU_KERNELS_VERSION:?}"
# From / with -P: upstream's WORKDIR /workspace/vllm holds vLLM's source tree, and a script run
# there would import that copy instead of the installed package.
cd /
exec /opt/venv/bin/python -P - "$VLLM_VERSION" "$TORCH_VERSION" "$XPU_KERNELS_VERSION" <<'PY'
import importlib
import importlib.metadata as md
import os
import pathlib
import sys

want_vllm, want_torch, want_kernels = sys.argv[1:]
STAND_IN = pathlib.Path("/etc/vllm-intel/stand-in")
stand_in = dict(
    line.split(maxsplit=1) for line in STAND_IN.read_text().splitlines() if line.strip()
) if STAND_IN.exists() else {}


class Problem(Exception):
    """A check's failure, with what it found."""


def torch_xpu():
    import torch

    if torch.__version__ != want_torch:
        raise Problem(f"torch {torch.__version__} != {want_torch}")
    if not getattr(torch.version, "xpu", None):
        raise Problem(f"torch {torch.__version__} was built without XPU support")
    return f"torch {torch.__version__} (xpu {torch.version.xpu})"


def device_count():
    import torch

    return f"{torch.xpu.device_count()} XPU device(s)"


def vllm():
    import vllm

    meta, plain = md.version("vllm"), vllm.__version__
    where = pathlib.Path(vllm.__file__).resolve()
    if meta != f"{want_vllm}+xpu":
        raise Problem(f"vllm's metadata says {meta}, not {want_vllm}+xpu")
    if plain != want_vllm:
        raise Problem(f"vllm.__version__ {plain} != {want_vllm}")
    if not where.is_relative_to("/opt/venv"):
        raise Problem(f"vllm imports from {where}, not /opt/venv")
    return f"vllm {meta} from {where.parent}"


def xpu_kernels():
    have = md.version("vllm_xpu_kernels")
    if have != want_kernels:
        raise Problem(f"vllm_xpu_kernels {have} != {want_kernels}")
    try:
        importlib.import_module("vllm_xpu_kernels._C")
    except ImportError as e:
        raise Problem(f"vllm_xpu_kernels._C does not load: {e}") from None
    return f"vllm_xpu_kernels {have}, _C loads"


def level_zero():
    dirs = ["/usr/include"]
    for var in ("CPATH", "C_INCLUDE_PATH"):
        dirs += [d for d in os.environ.get(var, "").split(":") if d]
    for d in dirs:
        if (pathlib.Path(d) / "level_zero" / "ze_api.h").is_file():
            return f"{d}/level_zero/ze_api.h"
    raise Problem(f"no level_zero/ze_api.h in {':'.join(dirs)} (Triton's XPU launcher cannot be compiled)")


CHECKS = {
    "torch-xpu": torch_xpu,
    "device-count": device_count,
    "vllm": vllm,
    "xpu-kernels": xpu_kernels,
    "level-zero": level_zero,
}
passed, failed, standing_in = [], [], []
for name, check in CHECKS.items():
    try:
        result, ok = check(), True
    except Problem as e:
        result, ok = str(e), False
    except Exception as e:  # a check that crashes has failed, with its reason
        result, ok = f"{type(e).__name__}: {e}", False
    if name in stand_in:
        standing_in.append(name)
        print(f"check-xpu-image: stand-in: {name}: {result} ({stand_in[name]})")
    elif ok:
        passed.append(name)
        print(f"check-xpu-image: ok: {name}: {result}")
    else:
        failed.append(name)
        print(f"check-xpu-image: FAILED: {name}: {result}", file=sys.stderr)
for name in stand_in.keys() - CHECKS.keys():  # what the stand-in is unlike upstream, unchecked
    print(f"check-xpu-image: stand-in: {name}: {stand_in[name]}")
print(
    f"check-xpu-image: {len(passed)} passed, {len(failed)} failed, "
    f"{len(standing_in)} not verified (stand-in: {' '.join(standing_in) or 'none'})"
)
sys.exit(1 if failed else 0)
PY
