#!/usr/bin/env bash
# Scheduled step: fail, naming it, when the package index has a vLLM release newer than the
# newest of docker/xpu-releases.toml. The failure's message is the command that reads the new
# release (`make upstream-release V=X`: its XPU recipe row, the patches' verdicts on its source,
# the CPU routes). Needs python3 with `packaging` and the index (PIP_INDEX_URL moves it); no Docker.
#
# Exit status (tools/upstream_release.py watch): 0 no newer release; 3 a newer release is out;
# 75 the index could not be asked (unreachable, an HTTP error, a malformed answer): the step fails
# saying so, with no release implied, and Buildkite's automatic retry on 75 asks again. Any other
# status is the tool's own failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python3 tools/upstream_release.py watch
