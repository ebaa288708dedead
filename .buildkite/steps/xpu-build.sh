#!/usr/bin/env bash
# Buildkite step on Intel CPU agents (network, Docker, no GPU): build the XPU image of VLLM_VERSION
# (one job per release of docker/xpu-releases.toml, pipeline.yml's matrix) and check inside it what
# needs no GPU: torch / vLLM / vllm_xpu_kernels import and are the recipe's releases,
# torch.xpu.device_count() answers 0 without crashing, `vllm --version` says +xpu, Level Zero's
# headers are there, `entrypoint.py patches` prints the expected states (tests/xpu, marker
# xpu_image). The build itself already fails when the stack does not load (check-xpu-image.sh).
# The XPU default release (docker/xpu-releases.toml) unless the job names one; lib.sh would
# take the CPU image's (the VLLM_VERSION file).
VLLM_VERSION=${VLLM_VERSION:-$(python3 "$(dirname "$0")/../../scripts/xpu_recipe.py" default)}
export VLLM_VERSION
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=xpu-lib.sh
source "$(dirname "$0")/xpu-lib.sh"
setup_step
build_xpu_images
# The image's SBOM as the job's artifact (docs/docker.md): LOG_DIR is uploaded.
"$DOCKER" run --rm --label "$RUN_LABEL" --entrypoint cat "$image" /opt/vllm-intel/sbom.cdx.json \
  >"$LOG_DIR/sbom-${image#vllm-intel:}.cdx.json"
in_image_tests xpu_image
