#!/usr/bin/env bash
# Buildkite step (nightly, on Intel CPU agents): `make soak`, CYCLES stop/start cycles of one CPU
# container under traffic with /dev/shm on a volume that outlives the container (as a Kubernetes
# emptyDir does), one cycle a SIGKILL crash. ~60 s a cycle; the image is built by the test
# (scripts/build-image.sh) if this agent does not have it yet.
# Environment: CYCLES (default 20), VLLM_VERSION, WHEELS_DIR, CA_BUNDLE (as scripts/build-image.sh).
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
setup_step

section ":repeat: soak: ${CYCLES:=20} stop/start cycles of vllm-intel:cpu-$VLLM_VERSION"
export CYCLES
network_retryable make soak PYTEST_ARGS="-ra"
