#!/bin/sh
# Print the stamp of the test and lint requirements of the checkout at DIR (default: this one):
# a venv whose .vllm-intel-req holds it has them installed. The one formula, shared by
# scripts/vllm-venv.sh and the `test` stage of both Dockerfiles.
#
#   scripts/requirements-stamp.sh [DIR]
set -eu
dir=${1:-$(dirname "$0")/..}
cat "$dir/requirements-test.txt" "$dir/requirements-lint.txt" | sha256sum | cut -c1-16
