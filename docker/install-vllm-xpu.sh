#!/bin/sh
# Create /opt/venv with vLLM built for Intel GPUs (VLLM_TARGET_DEVICE=xpu) from the release's
# source, with the XPU torch that release's requirements/xpu.txt pins. PyPI has no XPU build of
# vLLM (the `vllm` wheel is CUDA), so every XPU image builds vLLM from source, as upstream does.
#
# Env (from Dockerfile.xpu's ARGs): VLLM_VERSION, VLLM_SOURCE_URL, TORCH_VERSION (checked, so the
# label cannot lie), TORCH_INDEX_URL, IPEX_VERSION / ONECCL_BIND_PT_VERSION / IPEX_INDEX_URL
# (empty = not installed), WHEELS (optional local wheels).
set -eu
: "${VLLM_VERSION:?}" "${VLLM_SOURCE_URL:?}" "${TORCH_VERSION:?}"
python3 -m venv /opt/venv
pip="/opt/venv/bin/pip"
py="/opt/venv/bin/python"
set --
if [ -n "${TORCH_INDEX_URL:-}" ]; then set -- "$@" --extra-index-url "$TORCH_INDEX_URL"; fi
if ls "${WHEELS:-/nonexistent}"/*.whl >/dev/null 2>&1; then set -- "$@" --find-links "$WHEELS"; fi
"$pip" install -q --upgrade pip

src=$(mktemp -d)
url=$(echo "$VLLM_SOURCE_URL" | sed "s/{VLLM_VERSION}/$VLLM_VERSION/g")
"$py" -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' "$url" "$src/vllm.tar.gz"
tar -xzf "$src/vllm.tar.gz" -C "$src" --strip-components=1
cd "$src"
"$pip" install -q "$@" -r requirements/xpu.txt
if [ -n "${IPEX_VERSION:-}" ]; then
  "$pip" install -q "$@" --extra-index-url "${IPEX_INDEX_URL:?}" \
    "intel-extension-for-pytorch==$IPEX_VERSION" "oneccl_bind_pt==${ONECCL_BIND_PT_VERSION:?}"
fi
VLLM_TARGET_DEVICE=xpu "$pip" install -q --no-build-isolation --no-deps .
cd /
rm -rf "$src"
"$py" - "$TORCH_VERSION" <<'PY'
import sys, torch, vllm
assert torch.__version__ == sys.argv[1], f"torch {torch.__version__} != TORCH_VERSION {sys.argv[1]}"
print("torch", torch.__version__, "vllm", vllm.__version__)
PY
