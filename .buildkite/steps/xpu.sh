#!/usr/bin/env bash
# Buildkite step on Intel GPU agents (Data Center GPU Max/Flex, Arc; /dev/dri on the host), one job
# per release of docker/xpu-releases.toml: build the XPU image, run the GPU tests inside it
# (tests/xpu, marker xpu: on the vLLM release without upstream's XPU shutdown fix the restart on
# the same device is shown to hang without the xpu-shutdown patch and to serve with it), then the
# smoke test: serve, request, stop, restart the same container on the same device, request, stop.
# Environment: as scripts/build-image.sh; ZE_AFFINITY_MASK picks the GPU (default: all).
# The XPU default release (docker/xpu-releases.toml) unless the job names one; lib.sh would
# take the CPU image's (the VLLM_VERSION file).
VLLM_VERSION=${VLLM_VERSION:-$(python3 "$(dirname "$0")/../../scripts/xpu_recipe.py" default)}
export VLLM_VERSION
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=xpu-lib.sh
source "$(dirname "$0")/xpu-lib.sh"
setup_step

renders=(/dev/dri/renderD*)
render=${renders[0]}
[ -e "$render" ] || { echo "xpu: no /dev/dri/renderD* on this agent (wrong queue?)" >&2; exit 1; }
# The container user (uid 10001) reaches the render node through the host's group of that node;
# the by-path links are how the GPU driver and oneCCL find the devices.
gpu=(--device /dev/dri -v /dev/dri/by-path:/dev/dri/by-path:ro --group-add "$(stat -c %g "$render")"
     ${ZE_AFFINITY_MASK:+-e ZE_AFFINITY_MASK="$ZE_AFFINITY_MASK"})

build_xpu_images
in_image_tests "xpu or xpu_image" "${gpu[@]}"
section ":fire: smoke test $image on $render"
.buildkite/steps/smoke.sh "$image" "${gpu[@]}"
