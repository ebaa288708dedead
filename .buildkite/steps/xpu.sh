#!/usr/bin/env bash
# Buildkite step on Intel GPU agents (Data Center GPU Max/Flex, Arc; /dev/dri on the host):
# build the XPU image, then the smoke test on the agent's GPU: serve, request, stop, restart the
# same container on the same device (a worker that does not release its Level Zero context makes
# the second start hang or fail), request, stop. Build and run on one agent: no registry needed.
# Environment: as scripts/build-image.sh; ZE_AFFINITY_MASK picks the GPU (default: all).
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
setup_step

renders=(/dev/dri/renderD*)
render=${renders[0]}
[ -e "$render" ] || { echo "xpu: no /dev/dri/renderD* on this agent (wrong queue?)" >&2; exit 1; }

image=vllm-intel:xpu-$VLLM_VERSION
section ":docker: build $image"
network_retryable scripts/build-image.sh xpu

section ":fire: smoke test $image on $render"
# The container user (uid 10001) reaches the render node through the host's group of that node.
.buildkite/steps/smoke.sh "$image" --device /dev/dri --group-add "$(stat -c %g "$render")" \
  -e INTEL_VLLM_DEVICE=xpu ${ZE_AFFINITY_MASK:+-e ZE_AFFINITY_MASK="$ZE_AFFINITY_MASK"}
