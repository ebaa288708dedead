#!/bin/bash
# Source route of Dockerfile.xpu, `source-os` stage: what upstream's `vllm-base` stage installs on
# its base image, from docker/xpu-releases.toml (passed by scripts/build-image.sh as build args):
# Python, the GPU user-mode driver, from one of two sources (the table has exactly one):
#   .debs (XPU_UMD_DEBS, up to 0.33): IGC, compute-runtime, gmmlib, Level Zero and, where upstream
#     has it, the Level Zero dev package whose ze_api.h Triton's launcher is compiled against at
#     run time, all installed by one `dpkg -i`;
#   Intel's GPU apt repository (XPU_GPU_APT_*, since 0.34): its key dearmored into the keyring the
#     deb line names, the deb line as upstream writes it, then upstream's `apt-get install -y` of
#     the meta-package (with its Recommends, as upstream installs it);
# and, for the oneAPI-base releases, upstream's pinned oneAPI apt packages.
#
# Env: PYTHON_VERSION, XPU_UMD_DEBS (URLs) or XPU_GPU_APT_KEY (URL) + XPU_GPU_APT_REPO (a deb line)
#      + XPU_GPU_APT_PACKAGES, XPU_ONEAPI_APT, XPU_ONEAPI_APT_PIN.
set -euo pipefail
msg="build the XPU image with scripts/build-image.sh xpu (it passes the recipe of docker/xpu-releases.toml)"
: "${PYTHON_VERSION:?$msg}"
if [ -n "${XPU_UMD_DEBS:-}" ] && [ -n "${XPU_GPU_APT_PACKAGES:-}" ] \
  || [ -z "${XPU_UMD_DEBS:-}${XPU_GPU_APT_PACKAGES:-}" ]; then
  echo "install-xpu-os: exactly one of XPU_UMD_DEBS and XPU_GPU_APT_PACKAGES: $msg" >&2; exit 64
fi
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

if [ -n "${XPU_GPU_APT_PACKAGES:-}" ]; then
  : "${XPU_GPU_APT_KEY:?$msg}" "${XPU_GPU_APT_REPO:?$msg}"
  keyring=$(sed -nE 's/.*[[ ]signed-by=([^] ]+).*/\1/p' <<<"$XPU_GPU_APT_REPO")
  [ -n "$keyring" ] || { echo "install-xpu-os: no signed-by= in: $XPU_GPU_APT_REPO" >&2; exit 64; }
  install -d "$(dirname "$keyring")"
  curl -fsSL --retry 3 "$XPU_GPU_APT_KEY" | gpg --dearmor | tee "$keyring" >/dev/null
  echo "$XPU_GPU_APT_REPO" >/etc/apt/sources.list.d/intel-gpu.list
  # Error-Mode=any: upstream's; a repository that cannot be read fails here, not at the install.
  apt-get update -qq -o APT::Update::Error-Mode=any
  # shellcheck disable=SC2086  # a list of package names
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $XPU_GPU_APT_PACKAGES
else
  debs=$(mktemp -d)
  for url in $XPU_UMD_DEBS; do curl -fsSL --retry 3 -o "$debs/${url##*/}" "$url"; done
  dpkg -i "$debs"/*.deb
  rm -rf "$debs"
fi
