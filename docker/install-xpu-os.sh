#!/bin/bash
# Source route of Dockerfile.xpu, `source-os` stage: what upstream's `vllm-base` stage installs on
# its base image, from docker/xpu-releases.toml (passed by scripts/build-image.sh as build args):
# Python, the GPU user-mode driver .debs (IGC, compute-runtime, gmmlib, Level Zero and, where
# upstream has it, the Level Zero dev package whose ze_api.h Triton's launcher is compiled against
# at run time) and, for the oneAPI-base releases, upstream's pinned oneAPI apt packages.
#
# Env: PYTHON_VERSION, XPU_UMD_DEBS (URLs), XPU_ONEAPI_APT, XPU_ONEAPI_APT_PIN.
set -euo pipefail
msg="build the XPU image with scripts/build-image.sh xpu (it passes the recipe of docker/xpu-releases.toml)"
: "${PYTHON_VERSION:?$msg}" "${XPU_UMD_DEBS:?$msg}"
here=$(dirname "$0")
py="python$PYTHON_VERSION"
# build-essential + pythonX-dev: Triton compiles its launcher and inductor its C++ kernels at run
# time; the media libraries are the ones upstream installs for vLLM's multimodal inputs.
"$here/install-os-packages.sh" ca-certificates curl gpg "$py" "$py-venv" "$py-dev" build-essential \
  libnuma1 numactl libaio-dev ffmpeg libsndfile1 libsm6 libxext6 libgl1

if [ -n "${XPU_ONEAPI_APT:-}" ]; then
  : "${XPU_ONEAPI_APT_PIN:?oneAPI apt packages need a version pin}"
  # Into tee, as upstream does: `gpg -o` onto an existing keyring asks on a tty (exit 2 in a build).
  curl -fsSL https://apt.repos.intel.com/intel-gpg-keys/GPG-PUB-KEY-INTEL-SW-PRODUCTS.PUB \
    | gpg --dearmor | tee /usr/share/keyrings/oneapi-archive-keyring.gpg >/dev/null
  echo "deb [signed-by=/usr/share/keyrings/oneapi-archive-keyring.gpg] https://apt.repos.intel.com/oneapi all main" \
    >/etc/apt/sources.list.d/oneAPI.list
  printf '%s\n' 'Package: intel-oneapi-* intel-deep-learning-essentials* intel-pti*' \
    "Pin: version $XPU_ONEAPI_APT_PIN" 'Pin-Priority: 1001' >/etc/apt/preferences.d/oneapi.pref
  # shellcheck disable=SC2086  # a list of package names
  "$here/install-os-packages.sh" $XPU_ONEAPI_APT
fi

debs=$(mktemp -d)
for url in $XPU_UMD_DEBS; do curl -fsSL --retry 3 -o "$debs/${url##*/}" "$url"; done
dpkg -i "$debs"/*.deb
rm -rf "$debs"
