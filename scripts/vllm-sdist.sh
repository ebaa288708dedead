#!/usr/bin/env bash
# Print the path of vLLM VERSION's PyPI sdist (vllm-VERSION.tar.gz), downloaded once into the
# cache. pip itself checks it against sdist_sha256 of docker/xpu-releases.toml (--require-hashes),
# and a cached copy is checked again before it is used. The XPU image's source route and
# tests/xpu read upstream's recipe (docker/Dockerfile.xpu, requirements/xpu.txt) from it.
#
#   scripts/vllm-sdist.sh VERSION
#
# Why an sdist and not GitHub's tag archive: vLLM's setup.py takes its version from setuptools-scm,
# which finds none in a tag archive (no .git, no PKG-INFO): "unable to detect version".
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
version=${1:?usage: vllm-sdist.sh VERSION}
sha=$(python3 "$here/scripts/xpu_recipe.py" show "$version" \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["sdist_sha256"])')
cache=${VLLM_INTEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-intel}/sdists
out="$cache/vllm-$version.tar.gz"
mkdir -p "$cache"
exec 9>"$cache/.lock-$version"
flock 9
if [ -f "$out" ] && echo "$sha  $out" | sha256sum -c --quiet --status; then echo "$out"; exit 0; fi

# pip prepares the sdist's metadata before it keeps the file, by running vLLM's setup.py: that
# imports torch and needs setuptools-scm/-rust, so it runs without build isolation in the default
# vLLM venv (requirements-test.txt). VLLM_TARGET_DEVICE=empty + VLLM_VERSION_OVERRIDE make setup.py
# report exactly VERSION (else VERSION+empty or +cpu, which pip rejects as inconsistent).
py=${SDIST_PYTHON:-$("$here/scripts/vllm-venv.sh")/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "vllm==$version --hash=sha256:$sha" >"$tmp/requirements.txt"
echo "vllm-sdist: downloading vllm $version (sdist, sha256 $sha)" >&2
VLLM_TARGET_DEVICE=empty VLLM_VERSION_OVERRIDE="$version" "$py" -m pip download -q --no-deps \
  --no-binary :all: --no-build-isolation --require-hashes -r "$tmp/requirements.txt" -d "$tmp" >&2
mv "$tmp/vllm-$version.tar.gz" "$out"
echo "$out"
