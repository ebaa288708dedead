# Sourced by xpu-build.sh and xpu.sh: build the XPU runtime and test images of VLLM_VERSION (the
# route docker/xpu-releases.toml gives it, or XPU_ROUTE), and run the tests inside the test image.
# shellcheck shell=bash
image=vllm-intel:xpu-$VLLM_VERSION

build_xpu_images() {
  section ":docker: build $image ($(python3 scripts/xpu_recipe.py route "$VLLM_VERSION") route unless XPU_ROUTE)"
  network_retryable scripts/build-image.sh xpu
  section ":docker: build $image-test"
  TARGET="test" network_retryable scripts/build-image.sh xpu
}

# in_image_tests PYTEST_MARK [docker run args...]: pytest inside the XPU test image.
in_image_tests() {
  local mark=$1; shift
  section ":pytest: $mark tests inside $image-test"
  "$DOCKER" run --rm --label "$RUN_LABEL" --shm-size 2g "$@" "$image-test" -ra -m "$mark" tests/xpu
}
