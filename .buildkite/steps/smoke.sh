#!/usr/bin/env bash
# smoke.sh IMAGE [docker run args...]: start IMAGE, wait for its healthcheck, one completion,
# `docker stop` (must drain and exit 0 within the grace period), then start the SAME container
# again (same device, same /dev/shm) and do it all a second time. Every wait has a deadline: a
# hang fails the step instead of eating the job's timeout. Called by cpu.sh and xpu.sh.
# INTEL_VLLM_CACHE (optional, as compose's): a Docker volume name or a host directory (owned by
# uid 10001) for the compile caches at /home/vllm/.cache. Set on an agent, the jobs after the
# first one find the release's compiled graphs and kernels there and start warm.
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
use_engine
image=${1:?usage: smoke.sh IMAGE [docker run args...]}; shift
START_TIMEOUT=${START_TIMEOUT:-900}        # first start compiles kernels; XPU JIT is slow too
drain=${INTEL_VLLM_DRAIN_TIMEOUT:-30}
# The grace period from the image's own entrypoint, for the same drain and device.
grace=$("$DOCKER" run --rm -e INTEL_VLLM_DRAIN_TIMEOUT="$drain" "$@" "$image" grace-period)

cache=()
if [ -n "${INTEL_VLLM_CACHE:-}" ]; then cache=(-v "$INTEL_VLLM_CACHE:/home/vllm/.cache"); fi
cid=$("$DOCKER" run -d --label "$RUN_LABEL" --shm-size 2g -p 127.0.0.1::8000 "${cache[@]}" \
      -e INTEL_VLLM_DRAIN_TIMEOUT="$drain" "$@" "$image")
trap '"$DOCKER" rm -f "$cid" >/dev/null 2>&1 || true' EXIT
trap 'exit 130' INT TERM
fail() {  # the whole container log goes to the job's artifacts, its end to the job log
  echo "smoke: $*" >&2
  "$DOCKER" logs "$cid" >"$LOG_DIR/smoke-${image//[:\/]/_}.log" 2>&1 || true
  grep -n -m5 -iE 'error|exception' "$LOG_DIR/smoke-${image//[:\/]/_}.log" >&2 || true
  tail -n 40 "$LOG_DIR/smoke-${image//[:\/]/_}.log" >&2
  exit 1
}

wait_healthy() {
  local end=$(( $(date +%s) + START_TIMEOUT )) status
  while [ "$(date +%s)" -lt "$end" ]; do
    status=$("$DOCKER" inspect -f '{{.State.Status}} {{.State.Health.Status}}' "$cid")
    case "$status" in
      "running healthy") return 0 ;;
      exited*) fail "container exited while starting ($status)" ;;
    esac
    sleep 2
  done
  fail "not healthy after ${START_TIMEOUT}s"
}

complete() {
  local url model
  url="http://$("$DOCKER" port "$cid" 8000/tcp | head -n1)"
  model=$(curl -fsS --max-time 10 "$url/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
  curl -fsS --max-time 120 "$url/v1/completions" -H 'content-type: application/json' \
    -d "{\"model\": \"$model\", \"prompt\": \"def main(\", \"max_tokens\": 32}" \
    | python3 -c 'import json,sys; t=json.load(sys.stdin)["choices"][0]["text"]; assert t, "empty"; print("completion:", repr(t[:40]))'
}

stop() {
  local t0 took code
  t0=$(date +%s)
  timeout $(( grace + 30 )) "$DOCKER" stop -t "$grace" "$cid" >/dev/null || fail "docker stop hung"
  took=$(( $(date +%s) - t0 )); code=$("$DOCKER" inspect -f '{{.State.ExitCode}}' "$cid")
  echo "stop: ${took}s, exit $code (grace ${grace}s)"
  [ "$code" = 0 ] || fail "exit code $code after stop"
  [ "$took" -lt "$grace" ] || fail "stop took ${took}s: the engine had to kill it"
}

for round in 1 2; do
  echo "round $round: $image ($cid)"
  [ "$round" = 1 ] || "$DOCKER" start "$cid" >/dev/null
  wait_healthy
  complete || fail "completion failed"
  stop
done
echo "smoke: $image passed (serve, request, stop, restart, request, stop)"
