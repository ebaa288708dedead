# Sourced by every .buildkite/steps/*.sh (Buildkite agents and `make buildkite-local`):
# a Docker engine, a label for what this job starts, and a trap that removes it again.
# shellcheck shell=bash
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
export CI=${CI:-true}
DOCKER=${DOCKER:-/usr/bin/docker}          # the CLI the project's scripts use (BuildKit, no buildx)
VLLM_VERSION=${VLLM_VERSION:-$(cat VLLM_VERSION)}
export VLLM_VERSION
# Exit status for "a download failed": pipeline.yml retries it automatically (EX_TEMPFAIL).
EXIT_NETWORK=75
# Every container a step starts carries this label; the trap removes exactly those. Exported so
# that the scripts a step calls (smoke.sh) label theirs the same way.
RUN_ID=${VLLM_INTEL_CI_JOB:-${BUILDKITE_JOB_ID:-local-$$}}
export VLLM_INTEL_CI_JOB=$RUN_ID
RUN_LABEL="io.github.vllm-intel.ci-job=$RUN_ID"
LOG_DIR=${VLLM_INTEL_CI_LOGS:-$ROOT/build/buildkite}   # uploaded as artifacts
mkdir -p "$LOG_DIR"

section() { echo "--- $*"; }                 # a collapsible section in the Buildkite log

# shellcheck source=../../scripts/engine.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/engine.sh"

_cleanup() {
  local rc=$?
  section "cleanup (exit $rc)"
  local ids
  ids=$("$DOCKER" ps -aq --filter "label=$RUN_LABEL" 2>/dev/null || true)
  # shellcheck disable=SC2086  # one id per word
  [ -z "$ids" ] || "$DOCKER" rm -f $ids >/dev/null || true
  # Old images: each rebuild leaves the previous vllm-intel image untagged; remove those older than
  # IMAGE_KEEP_HOURS. Only ours (by label), never tagged ones, never other projects' images.
  "$DOCKER" image prune -f --filter "label=org.opencontainers.image.title=vllm-intel" \
    --filter "until=${IMAGE_KEEP_HOURS:-72}h" >/dev/null || true
  # The BuildKit cache of a long-lived agent grows without bound; on a developer machine keep it.
  if [ -n "${BUILDKITE:-}" ]; then
    "$DOCKER" builder prune -f --filter "until=${BUILD_CACHE_KEEP_HOURS:-168}h" >/dev/null || true
  fi
  release_engine
  exit "$rc"
}

# The agents' registry login (pipeline.yml's header): pulls of the base images and of upstream's
# ~10 GB XPU image are rate-limited when anonymous. The password goes on stdin, never in argv.
registry_login() {
  if [ -z "${REGISTRY_USER:-}" ] || [ -z "${REGISTRY_PASSWORD:-}" ]; then
    echo "registry: REGISTRY_USER/REGISTRY_PASSWORD not set: pulls are anonymous (rate-limited)" >&2
    return 0
  fi
  printf '%s' "$REGISTRY_PASSWORD" \
    | "$DOCKER" login --username "$REGISTRY_USER" --password-stdin ${REGISTRY:+"$REGISTRY"} >/dev/null
}

setup_step() {  # what every top-level step does first
  use_engine
  registry_login
  trap _cleanup EXIT
  trap 'exit 130' INT TERM
  # Agents without the PyTorch CPU index keep the torch wheel on disk (as CI machines do).
  if [ -z "${WHEELS_DIR:-}" ] && [ -d /opt/wheels ]; then export WHEELS_DIR=/opt/wheels; fi
}

# network_retryable CMD...: run CMD; if it fails and its output shows a download error, exit with
# EXIT_NETWORK so that Buildkite retries the job; any other failure keeps its own exit status.
# The output is also kept in build/buildkite/ (uploaded as the job's artifacts).
network_retryable() {
  local log rc=0
  log=$(mktemp "$LOG_DIR/$(basename "$1").XXXXXX.log")
  "$@" 2>&1 | tee "$log" || rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ] && grep -Eqi 'temporary failure in name resolution|connection (reset|refused|timed out)|read timed out|could not resolve host|failed to fetch|network is unreachable|TLS handshake timeout|503 Service Unavailable|ReadTimeoutError|ProtocolError' "$log"; then
    echo "network error in: $*  (exit $rc -> $EXIT_NETWORK, retried by Buildkite)" >&2
    exit "$EXIT_NETWORK"
  fi
  return "$rc"
}
