#!/bin/bash
# The stand-in's one install step (tests/standins/Dockerfile.upstream-xpu): the venv, CPU torch
# in place of XPU torch, vLLM's common requirements, vLLM built for XPU from the sdist, the
# table's vllm_xpu_kernels and oneAPI runtime wheels, and the list of what stands in.
# Env: VLLM_VERSION, VLLM_SDIST_SHA256, XPU_KERNELS_VERSION, XPU_KERNELS_INDEX_URL, XPU_ONEAPI_PIP,
#      XPU_GPU_APT_REPO + XPU_GPU_APT_PACKAGES (the driver the list names; empty: the .debs),
#      STAND_IN_TORCH.
set -euo pipefail
: "${VLLM_VERSION:?}" "${VLLM_SDIST_SHA256:?}" "${XPU_KERNELS_VERSION:?}" "${STAND_IN_TORCH:?}"
# PyTorch's XPU index is upstream's setting for the image's users; nothing here comes from it.
export PIP_EXTRA_INDEX_URL=
sdist=/tmp/sdist/vllm-$VLLM_VERSION.tar.gz
echo "$VLLM_SDIST_SHA256  $sdist" | sha256sum -c -
tar -xzf "$sdist" -C /workspace/vllm --strip-components=1
python3 -m venv /opt/venv
/opt/venv/bin/pip install -q --upgrade pip
# uv, as upstream's Dockerfile.xpu installs with: pip's resolver spends minutes of CPU on vLLM's
# requirements, uv seconds. Outside the venv (/usr/local/bin), so the stand-in's venv holds what
# upstream's does. Its cache is the build's cache mount; it byte-compiles as pip would.
python3 -m venv /tmp/uv-venv
/tmp/uv-venv/bin/pip install -q uv
install -m 0755 /tmp/uv-venv/bin/uv /usr/local/bin/uv
rm -rf /tmp/uv-venv
# The cache is a cache mount and the venv a layer: uv cannot hard-link across them.
export UV_LINK_MODE=copy UV_HTTP_TIMEOUT=${UV_HTTP_TIMEOUT:-180}
uv=(uv pip install --quiet --python /opt/venv/bin/python --compile-bytecode)
links=()
if ls /tmp/wheels/*.whl >/dev/null 2>&1; then links=(--find-links /tmp/wheels); fi
# requirements/xpu.txt (it includes common.txt and vLLM's build requirements) minus what is
# not on PyPI for this machine: its extra indexes, XPU torch and its companions, Triton for XPU,
# the kernels (installed below without their torch pin).
grep -vE '^(--extra-index-url|torch|triton|vllm_xpu_kernels|vllm-xpu-kernels)' requirements/xpu.txt \
  >requirements/xpu-stand-in.txt
"${uv[@]}" "${links[@]}" "torch==$STAND_IN_TORCH" -r requirements/xpu-stand-in.txt
rm requirements/xpu-stand-in.txt
VLLM_TARGET_DEVICE=xpu "${uv[@]}" --no-build-isolation --no-deps .
# The pins upstream installs after vLLM: from PyPI, as pip resolves them; --no-deps so that the
# kernels' torch pin does not replace the CPU torch standing in.
# shellcheck disable=SC2086  # a list of requirement specifiers
if [ -n "${XPU_ONEAPI_PIP:-}" ]; then "${uv[@]}" --no-deps $XPU_ONEAPI_PIP; fi
# Some releases take their kernels from a GitHub asset, others (since 0.34) from the kernels' own
# index, that PyPI does not carry under that version: the stand-in asks PyPI only.
kernels="vllm_xpu_kernels $XPU_KERNELS_VERSION from PyPI cannot load without torch built with XPU"
if ! "${uv[@]}" --no-deps "vllm_xpu_kernels==$XPU_KERNELS_VERSION"; then
  where="its GitHub release"
  if [ -n "${XPU_KERNELS_INDEX_URL:-}" ]; then where="its index $XPU_KERNELS_INDEX_URL"; fi
  kernels="vllm_xpu_kernels $XPU_KERNELS_VERSION is not on PyPI (upstream installs it from $where)"
fi
driver="the table's Level Zero .deb"
if [ -n "${XPU_GPU_APT_PACKAGES:-}" ]; then
  # The deb line's suite, e.g. noble/intel-omix/0.4.1.
  suite=$(awk '{for (i = 1; i <= NF; i++) if ($i ~ /^https?:/) { print $(i + 1); exit }}' <<<"${XPU_GPU_APT_REPO:-}")
  driver="$XPU_GPU_APT_PACKAGES of Intel's GPU apt repository ($suite, not reachable here)"
fi
# Like vLLM's CPU install: these arrive as CUDA builds and break imports on a CPU-only torch.
uv pip uninstall --quiet --python /opt/venv/bin/python torchvision torchaudio torchcodec triton || true
mkdir -p /etc/vllm-intel
cat >/etc/vllm-intel/stand-in <<EOF_LIST
torch-xpu torch $STAND_IN_TORCH (CPU build) stands in for PyTorch's XPU build
xpu-kernels $kernels
python Debian's Python $(/opt/venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])') stands in for upstream's 3.12
level-zero Debian's libze-dev stands in for $driver
EOF_LIST
