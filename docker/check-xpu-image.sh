#!/bin/bash
# The XPU image's `vllm` stage, both routes: fail the build unless the environment is the recipe's
# and loads without a GPU (build machines have none): torch is TORCH_VERSION with XPU support,
# `torch.xpu.device_count()` answers (0 here) instead of crashing, vLLM is VLLM_VERSION+xpu,
# vllm_xpu_kernels is the pinned release and its _C extension loads (libsycl found through
# LD_LIBRARY_PATH), and Level Zero's ze_api.h is where Triton's launcher build looks for it.
#
# Env: VLLM_VERSION, TORCH_VERSION, XPU_KERNELS_VERSION.
set -euo pipefail
: "${VLLM_VERSION:?}" "${TORCH_VERSION:?}" "${XPU_KERNELS_VERSION:?}"
/opt/venv/bin/python - "$VLLM_VERSION" "$TORCH_VERSION" "$XPU_KERNELS_VERSION" <<'PY'
import importlib.metadata as md
import sys

import torch
import vllm
import vllm_xpu_kernels._C  # noqa: F401

want_vllm, want_torch, want_kernels = sys.argv[1:]
problems = []
if torch.__version__ != want_torch:
    problems.append(f"torch {torch.__version__} != {want_torch}")
if not getattr(torch.version, "xpu", None):
    problems.append("torch was built without XPU support")
count = torch.xpu.device_count()
if vllm.__version__ != f"{want_vllm}+xpu":
    problems.append(f"vllm {vllm.__version__} != {want_vllm}+xpu")
if md.version("vllm_xpu_kernels") != want_kernels:
    problems.append(f"vllm_xpu_kernels {md.version('vllm_xpu_kernels')} != {want_kernels}")
for p in problems:
    print("check-xpu-image:", p, file=sys.stderr)
print(f"check-xpu-image: torch {torch.__version__} (xpu {torch.version.xpu}, {count} device(s)), "
      f"vllm {vllm.__version__}, vllm_xpu_kernels {md.version('vllm_xpu_kernels')}")
sys.exit(1 if problems else 0)
PY
for dir in /usr/include ${CPATH//:/ } ${C_INCLUDE_PATH//:/ }; do
  if [ -f "$dir/level_zero/ze_api.h" ]; then echo "check-xpu-image: $dir/level_zero/ze_api.h"; exit 0; fi
done
echo "check-xpu-image: no level_zero/ze_api.h (Triton's XPU launcher cannot be compiled)" >&2
exit 1
