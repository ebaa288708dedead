#!/usr/bin/env bash
# Restart the replicas of compose.replicas.yaml one at a time, the way an orchestrator replaces
# pods (docs/deploy.md, "Replicas behind a load balancer"): for each replica
#   1. wait until every other replica is healthy and UP in HAProxy (never two down at once),
#   2. set it to DRAIN in HAProxy (no new requests) and wait LB_DRAIN_SECONDS (5): what removing a
#      pod from the endpoints plus the preStop sleep do in Kubernetes: new requests go to the
#      other replicas instead of being refused with 503 and replayed,
#   3. `docker stop -t GRACE` it: SIGTERM starts entrypoint.py's drain (in-flight requests finish,
#      new ones get 503, which HAProxy replays on another replica); GRACE is what
#      `entrypoint.py grace-period` prints inside that container; then the DRAIN is lifted,
#   4. `docker start` it and wait until it is healthy and HAProxy has it UP again.
# Prints each step with its timing; exit 1 if a replica does not come back in READY_TIMEOUT.
#
#   scripts/rolling-restart.sh [compose options...]      (= make rolling-restart)
#     e.g. --env-file .env, or -f another-override.yaml (layered after compose.replicas.yaml)
# Environment: COMPOSE_PROJECT_NAME etc. as for compose; READY_TIMEOUT (default 600 s);
# LB_DRAIN_SECONDS (default 5);
# DOCKER_HOST (default: the engine scripts/docker-engine.sh status finds).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
docker=${DOCKER:-/usr/bin/docker}
ready_timeout=${READY_TIMEOUT:-600}
lb_drain=${LB_DRAIN_SECONDS:-5}
opts=("$@")
if [ -z "${DOCKER_HOST:-}" ] && h=$("$here/scripts/docker-engine.sh" status 2>/dev/null); then
  export DOCKER_HOST=$h
fi

compose() { "$here/scripts/compose.sh" -f "$here/compose.replicas.yaml" "${opts[@]}" "$@"; }
now() { echo "${EPOCHREALTIME/./}"; }                       # microseconds
secs() { printf '%d.%d' $(( ($2 - $1) / 1000000 )) $(( ($2 - $1) % 1000000 / 100000 )); }
say() { printf '[rolling-restart %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

lb=$(compose ps -q lb)
mapfile -t replicas < <(compose ps -q vllm-cpu)
[ -n "$lb" ] || { echo "rolling-restart: no running lb service (make up-replicas)" >&2; exit 1; }
[ ${#replicas[@]} -gt 0 ] || { echo "rolling-restart: no vllm-cpu replica" >&2; exit 1; }

name() { "$docker" inspect -f '{{.Name}}' "$1" | tr -d /; }
ip() { "$docker" inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}' "$1" | awk '{print $1}'; }
health() { "$docker" inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$1"; }

# One command of HAProxy's runtime CLI, run inside the LB container (haproxy.cfg: 127.0.0.1:8405,
# not published).
lb_cli() {
  # shellcheck disable=SC2016  # $1 is expanded by the inner bash
  "$docker" exec "$lb" bash -c 'exec 3<>/dev/tcp/127.0.0.1/8405 && echo "$1" >&3 && cat <&3' _ "$1"
}

# HAProxy's view of the replica at IP: a column (status: UP, DOWN, MAINT...; svname: its slot) of
# `show stat`.
lb_field() {
  local addr=$1 field=$2
  lb_cli "show stat" |
    awk -F, -v addr="$addr:8000" -v field="$field" '
      /^# pxname/ { for (i = 1; i <= NF; i++) { h = $i; sub(/^# /, "", h); col[h] = i }; next }
      col["addr"] && $1 == "vllm" && $col["addr"] == addr { print $col[field]; found = 1 }
      END { if (!found) print "absent" }' | head -n1
}
lb_status() { lb_field "$1" status; }

healthy() { [ "$(health "$1")" = healthy ]; }
exited() { [ "$("$docker" inspect -f '{{.State.Running}}' "$1")" = false ]; }

ready() {  # healthy for Docker and UP in HAProxy
  local c=$1 a
  healthy "$c" || return 1
  a=$(ip "$c"); [ -n "$a" ] || return 1
  [ "$(lb_status "$a")" = UP ]
}

wait_for() {  # wait_for DESCRIPTION COMMAND...: poll until COMMAND succeeds or READY_TIMEOUT
  local what=$1 start; shift
  start=$(now)
  until "$@"; do
    if [ $(( ($(now) - start) / 1000000 )) -ge "$ready_timeout" ]; then
      say "FAILED: $what not reached after ${ready_timeout} s"; return 1
    fi
    sleep 0.5
  done
}

others_ready() {
  local c
  for c in "${replicas[@]}"; do [ "$c" = "$1" ] || ready "$c" || return 1; done
}

total0=$(now)
say "${#replicas[@]} replicas: $(for c in "${replicas[@]}"; do printf '%s ' "$(name "$c")"; done)"
for c in "${replicas[@]}"; do
  n=$(name "$c")
  t0=$(now)
  wait_for "the other replicas ready" others_ready "$c"
  t1=$(now)
  grace=$("$docker" exec "$c" /opt/venv/bin/python /opt/vllm-intel/entrypoint.py grace-period)
  slot=$(lb_field "$(ip "$c")" svname)
  say "$n: others ready after $(secs "$t0" "$t1") s; HAProxy slot $slot set to DRAIN, ${lb_drain} s"
  lb_cli "set server vllm/$slot state drain" >/dev/null
  sleep "$lb_drain"
  say "$n: docker stop -t $grace (drain)"
  # On a busy host the engine may report a failed stop while the container is still exiting:
  # starting it again is only safe once it has exited.
  "$docker" stop -t "$grace" "$c" >/dev/null || say "$n: docker stop reported an error; waiting for the exit"
  wait_for "$n exited" exited "$c"
  # The slot follows DNS: lift the DRAIN so that whichever replica gets it next receives traffic.
  lb_cli "set server vllm/$slot state ready" >/dev/null
  t2=$(now)
  code=$("$docker" inspect -f '{{.State.ExitCode}}' "$c")
  say "$n: stopped in $(secs "$t1" "$t2") s, exit $code; docker start"
  "$docker" start "$c" >/dev/null
  wait_for "$n healthy" healthy "$c"
  t3=$(now)
  wait_for "$n UP in HAProxy" ready "$c"
  t4=$(now)
  say "$n: healthy $(secs "$t2" "$t3") s after start, UP in HAProxy $(secs "$t3" "$t4") s later;" \
      "replaced in $(secs "$t0" "$t4") s"
done
say "done: ${#replicas[@]} replicas restarted one at a time in $(secs "$total0" "$(now)") s"
