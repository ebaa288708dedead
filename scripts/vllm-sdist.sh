#!/usr/bin/env bash
# Print the path of vLLM VERSION's PyPI sdist (vllm-VERSION.tar.gz), downloaded once into the
# cache and checked against sdist_sha256 of docker/xpu-releases.toml (a cached copy is checked
# again before it is used). The XPU image's source route, its stand-in and tests/xpu read
# upstream's recipe (docker/Dockerfile.xpu, requirements/xpu.txt) from it.
#
#   scripts/vllm-sdist.sh VERSION
#
# VLLM_SDIST_TRUST_INDEX=1 (the CPU image's upstream-wheel route, scripts/cpu_pins.py): for a
# release the table does not have, the sha256 is the one the index's JSON states (said on stderr);
# a release the table has is checked against the table as always.
#
# Needs only curl, sha256sum and python3's standard library: no venv, no torch. The file's URL
# comes from the package index's JSON simple API (PEP 691); the index's own sha256 must equal
# the table's before anything is downloaded. PIP_INDEX_URL (a PEP 503/691 index) moves the index.
#
# Why an sdist and not GitHub's tag archive: vLLM's setup.py takes its version from setuptools-scm,
# which finds none in a tag archive (no .git, no PKG-INFO): "unable to detect version".
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
version=${1:?usage: vllm-sdist.sh VERSION}
index=${PIP_INDEX_URL:-https://pypi.org/simple}
if [ "${VLLM_SDIST_TRUST_INDEX:-0}" = 1 ] && { known=$(python3 "$here/scripts/xpu_recipe.py" versions) \
    || exit 64; ! grep -qxF "$version" <<<"$known"; }; then
  sha=$(curl -fsSL --retry 3 -H 'Accept: application/vnd.pypi.simple.v1+json' "${index%/}/vllm/" \
    | python3 -c '
import json, sys
name = sys.argv[1]
files = [f for f in json.load(sys.stdin)["files"] if f["filename"] == name]
if not files or not files[0]["hashes"].get("sha256"):
    sys.exit(f"vllm-sdist: the index lists no {name} (with a sha256)")
print(files[0]["hashes"]["sha256"])' "vllm-$version.tar.gz") || exit 64
  echo "vllm-sdist: vLLM $version is not in docker/xpu-releases.toml; sha256 $sha of its sdist taken from the index's JSON (PEP 691, ${index%/}/vllm/)" >&2
else
  sha=$(python3 "$here/scripts/xpu_recipe.py" field "$version" sdist_sha256) || exit 64
fi
cache=${VLLM_INTEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-intel}/sdists
name="vllm-$version.tar.gz"
out="$cache/$name"
mkdir -p "$cache"
exec 9>"$cache/.lock-$version"
flock 9
if [ -f "$out" ] && echo "$sha  $out" | sha256sum -c --quiet --status; then echo "$out"; exit 0; fi

url=$(curl -fsSL --retry 3 -H 'Accept: application/vnd.pypi.simple.v1+json' "${index%/}/vllm/" \
  | python3 -c '
import json, sys
name, sha = sys.argv[1:]
files = [f for f in json.load(sys.stdin)["files"] if f["filename"] == name]
if not files:
    sys.exit(f"vllm-sdist: the index lists no {name}")
got = files[0]["hashes"].get("sha256")
if got != sha:
    sys.exit(f"vllm-sdist: the index says {name} has sha256 {got}, the table {sha}")
print(files[0]["url"])' "$name" "$sha")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "vllm-sdist: downloading $name (sha256 $sha)" >&2
curl -fsSL --retry 3 -o "$tmp/$name" "$url"
echo "$sha  $tmp/$name" | sha256sum -c --quiet -
mv "$tmp/$name" "$out"
echo "$out"
