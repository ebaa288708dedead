#!/bin/bash
# Source route of Dockerfile.xpu, `source` stage: /opt/venv with vLLM built for Intel GPUs from the
# release's PyPI sdist, the way upstream's docker/Dockerfile.xpu does it for that release (recipe:
# docker/xpu-releases.toml, passed by scripts/build-image.sh as build args):
#   requirements/xpu.txt of the sdist itself (torch from PyTorch's XPU index, vllm_xpu_kernels from
#   PyPI or, since 0.34, from the kernels' own index, Triton for XPU), upstream's Triton reinstall and oneCCL installer where it has them, vLLM with
#   VLLM_TARGET_DEVICE=xpu (no extensions to compile: kernels come from vllm_xpu_kernels), then
#   upstream's oneAPI runtime wheel pins. vLLM's Rust frontend is not built: it is optional
#   (setup.py requires it only with VLLM_REQUIRE_RUST_FRONTEND) and the Python server serves.
#
# Env: VLLM_VERSION, VLLM_SDIST_SHA256, PYTHON_VERSION, TORCH_INDEX_URL, XPU_KERNELS_INDEX_URL
#      ("" = PyPI), XPU_TRITON,
#      XPU_TRITON_REINSTALL, XPU_ONECCL_INSTALLER, XPU_ONEAPI_PIP; SDIST_DIR (the sdist's folder).
set -euo pipefail
msg="build the XPU image with scripts/build-image.sh xpu (it fetches the sdist and passes the recipe)"
: "${VLLM_VERSION:?$msg}" "${VLLM_SDIST_SHA256:?$msg}" "${PYTHON_VERSION:?$msg}"
sdist="${SDIST_DIR:?}/vllm-$VLLM_VERSION.tar.gz"
[ -f "$sdist" ] || { echo "install-vllm-xpu: no $sdist: $msg" >&2; exit 1; }
echo "$VLLM_SDIST_SHA256  $sdist" | sha256sum -c -

"python$PYTHON_VERSION" -m venv /opt/venv
pip=/opt/venv/bin/pip
"$pip" install -q --upgrade pip
src=$(mktemp -d)
tar -xzf "$sdist" -C "$src" --strip-components=1
set --
if [ -n "${TORCH_INDEX_URL:-}" ]; then set -- --extra-index-url "$TORCH_INDEX_URL"; fi
# The table's index for the kernels (requirements/xpu.txt carries the same line since 0.34): the
# recipe, checked against upstream, says where they come from, and the build log shows it.
if [ -n "${XPU_KERNELS_INDEX_URL:-}" ]; then set -- "$@" --extra-index-url "$XPU_KERNELS_INDEX_URL"; fi
"$pip" install -q "$@" -r "$src/requirements/xpu.txt"
if [ "${XPU_TRITON_REINSTALL:-0}" = 1 ]; then
  "$pip" uninstall -q -y triton triton-xpu || true
  "$pip" install -q "$@" "${XPU_TRITON:?}"
fi
if [ -n "${XPU_ONECCL_INSTALLER:-}" ]; then
  # Upstream replaces pip's oneCCL by this release's installer and points ccl/latest at it.
  "$pip" uninstall -q -y oneccl oneccl-devel || true
  curl -fsSL --retry 3 -o /tmp/oneccl.sh "$XPU_ONECCL_INSTALLER"
  bash /tmp/oneccl.sh -a --silent --eula accept
  rm /tmp/oneccl.sh
  ccl=$(basename "$XPU_ONECCL_INSTALLER" | sed -E 's/^intel-oneccl-([0-9]+\.[0-9]+).*/\1/')
  ln -sfn "/opt/intel/oneapi/ccl/$ccl" /opt/intel/oneapi/ccl/latest
fi
VLLM_TARGET_DEVICE=xpu "$pip" install -q --no-build-isolation --no-deps "$src"
# shellcheck disable=SC2086  # a list of requirement specifiers
if [ -n "${XPU_ONEAPI_PIP:-}" ]; then "$pip" install -q "$@" $XPU_ONEAPI_PIP; fi
rm -rf "$src"
