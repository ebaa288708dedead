#!/usr/bin/env bash
# Scheduled step: fail, naming it, when the package index has a vLLM release newer than the
# newest of docker/xpu-releases.toml. The failure's message is the command that reads the new
# release (`make upstream-release V=X`: its XPU recipe row, the patches' verdicts on its source,
# the CPU routes). Needs python3 with `packaging` and the index (PIP_INDEX_URL moves it); no Docker.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python3 tools/upstream_release.py watch
