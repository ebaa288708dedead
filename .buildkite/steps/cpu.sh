#!/usr/bin/env bash
# Buildkite step on Intel CPU agents, and `make buildkite-local` on any machine with root/Docker:
#   1. build the CPU runtime and test images (scripts/build-image.sh, the one build command);
#      the runtime image's SBOM goes to build/buildkite/ (an artifact)
#   2. run the project's tests inside the test image (its CMD: everything but Docker/XPU tests)
#   3. smoke test the runtime image: serve, request, stop, restart, request, stop (smoke.sh)
#   4. the container tests from the host (`make test`, as .ci/run does), which also run the
#      kubelet-style termination of the Kubernetes manifest
# Environment: VLLM_VERSION, WHEELS_DIR, CA_BUNDLE (as scripts/build-image.sh); PYTEST_ARGS for 4
# (default: the Docker tests only; 2 runs the rest); SKIP_IN_IMAGE_TESTS=1 skips 2; IN_IMAGE_ARGS
# replaces 2's pytest arguments (default: the test image's CMD); HOST_TESTS=0 skips 4 (`make test`
# runs this step with it: 4 is `make test` itself).
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
setup_step

# Scheduled (nightly) builds also run the CPU image's lifecycle on the older release the tests
# follow (tests/container/test_cpu_image.py) and 300 fuzz examples of the entrypoint's inputs
# (tests/supervisor/test_fuzz_inputs.py) and the negative controls (tests/harness: control);
# every other run, the default release, 60 examples and no controls.
if [ "${BUILDKITE_SOURCE:-}" = schedule ]; then
  export INTEL_VLLM_CPU_RELEASES=all FUZZ_EXAMPLES=300 INTEL_VLLM_CONTROLS=all
fi
image=vllm-intel:cpu-$VLLM_VERSION
section ":docker: build $image"
network_retryable scripts/build-image.sh cpu
# The image's SBOM as the job's artifact (docs/docker.md): LOG_DIR is uploaded.
"$DOCKER" run --rm --label "$RUN_LABEL" --entrypoint cat "$image" /opt/vllm-intel/sbom.cdx.json \
  >"$LOG_DIR/sbom-${image#vllm-intel:}.cdx.json"
section ":docker: build $image-test"
TARGET="test" network_retryable scripts/build-image.sh cpu

if [ "${SKIP_IN_IMAGE_TESTS:-0}" != 1 ]; then
  section ":pytest: tests inside $image-test"
  # Tests that create another release's venv install from PyPI inside the container: give pip the
  # same extra CA bundle and local wheels the image build got (never stored in the image).
  ca=$(scripts/ca-bundle.sh)
  run_args=(--rm --label "$RUN_LABEL" --shm-size 2g -e FUZZ_EXAMPLES -e INTEL_VLLM_CONTROLS)
  if [ -n "$ca" ]; then
    run_args+=(-v "$ca:/run/ci/ca.pem:ro" -e PIP_CERT=/run/ci/ca.pem)
  fi
  if [ -n "${WHEELS_DIR:-}" ]; then
    run_args+=(-v "$WHEELS_DIR:/run/ci/wheels:ro" -e PIP_FIND_LINKS=/run/ci/wheels)
  fi
  # shellcheck disable=SC2086  # IN_IMAGE_ARGS: pytest arguments, split on blanks
  network_retryable "$DOCKER" run "${run_args[@]}" "$image-test" ${IN_IMAGE_ARGS:-}
fi

section ":fire: smoke test $image"
# A fixed KV cache as compose.yaml and the k8s overlay set it: vLLM's CPU default wants 92% of the
# host's memory free and fails on a shared agent. The smoke waits for "healthy": checked every 2 s
# instead of the image's 10 s.
.buildkite/steps/smoke.sh "$image" -e VLLM_CPU_KVCACHE_SPACE=1 --health-interval 2s

if [ "${HOST_TESTS:-1}" != 0 ]; then
  section ":pytest: container tests (make test)"
  make test PYTEST_ARGS="${PYTEST_ARGS:--m docker -ra}"
fi
