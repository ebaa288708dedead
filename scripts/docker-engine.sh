#!/usr/bin/env bash
# Give the tests, the Makefile and CI a Docker engine, and print the DOCKER_HOST to use.
#
#   scripts/docker-engine.sh start    reuse an engine that answers, else install docker.io (if
#                                     missing) and start our own isolated dockerd; prints DOCKER_HOST
#   scripts/docker-engine.sh stop     stop the dockerd that `start` launched (and nothing else)
#   scripts/docker-engine.sh status   print DOCKER_HOST and exit 0 if an engine answers, else 1
#
# Why our own dockerd: CI machines are fresh Debian bookworm hosts with no engine running and no
# systemd to start one. Its --data-root lives under a persistent directory so that the base image,
# the built layers and the BuildKit cache mounts (pip downloads) survive between CI runs on the
# same machine; its exec-root, socket and pidfile are its own, so it never touches a system
# engine. Must run as root. Log: $VLLM_INTEL_DOCKER_ROOT/dockerd.log.
set -euo pipefail

root=${VLLM_INTEL_DOCKER_ROOT:-/var/lib/vllm-intel-docker}   # persistent: images + build cache
run=${VLLM_INTEL_DOCKER_RUN:-/run/vllm-intel-docker}         # volatile: exec-root, socket, pidfile
sock="$run/docker.sock"
pidfile="$run/dockerd.pid"
our_host="unix://$sock"
# The Debian CLI (20.10) is the one that builds with BuildKit; a newer /usr/local/bin/docker
# without buildx cannot. Every script of ours calls this one.
docker=${DOCKER:-/usr/bin/docker}

log() { echo "docker-engine: $*" >&2; }

answers() {  # answers HOST -> 0 if a Docker engine answers there
  [ -x "$docker" ] && DOCKER_HOST=$1 timeout 10 "$docker" version --format '{{.Server.Version}}' >/dev/null 2>&1
}

current_host() {  # the first engine that answers: $DOCKER_HOST, ours, the system one
  local h
  for h in ${DOCKER_HOST:-} "$our_host" unix:///var/run/docker.sock; do
    if answers "$h"; then echo "$h"; return 0; fi
  done
  return 1
}

install_packages() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  [ -x /usr/bin/docker ] || missing+=(docker.io)
  command -v iptables >/dev/null || missing+=(iptables)
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" = 0 ] || { log "need root to install ${missing[*]}"; exit 1; }
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

start() {
  local h
  if h=$(current_host); then echo "$h"; return 0; fi
  [ "$(id -u)" = 0 ] || { log "no engine answers and starting one needs root"; exit 1; }
  install_packages
  mkdir -p "$root/data" "$run"
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    log "dockerd $(cat "$pidfile") exists but does not answer yet; waiting for it"
  else
    rm -f "$pidfile" "$sock"
    log "starting dockerd (data-root $root/data, socket $sock)"
    # setsid: the daemon must outlive the shell/pytest that started it; `stop` ends it by pid.
    # It keeps none of its starter's descriptors beyond stdio (a caller's `flock` lock, held
    # otherwise for the daemon's life). --pidfile is written by dockerd itself; it also starts
    # its own containerd under exec-root.
    (
      for fd in /proc/self/fd/*; do
        fd=${fd##*/}
        if [ "$fd" -gt 2 ]; then eval "exec $fd>&-"; fi
      done
      exec setsid dockerd \
        --data-root "$root/data" \
        --exec-root "$run/exec" \
        --pidfile "$pidfile" \
        -H "$our_host" \
        >>"$root/dockerd.log" 2>&1 </dev/null
    ) &
  fi
  for _ in $(seq 1 120); do
    if answers "$our_host"; then echo "$our_host"; return 0; fi
    sleep 0.5
  done
  log "dockerd did not answer within 60 s; last log lines:"
  tail -n 20 "$root/dockerd.log" >&2
  exit 1
}

stop() {
  [ -f "$pidfile" ] || { log "no dockerd of ours is running"; return 0; }
  local pid; pid=$(cat "$pidfile")
  if ! kill -0 "$pid" 2>/dev/null; then rm -f "$pidfile"; return 0; fi
  # Only the daemon we started: its command line must name our socket.
  if ! tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$our_host"; then
    log "pid $pid in $pidfile is not our dockerd; leaving it alone"; exit 1
  fi
  log "stopping dockerd $pid"
  kill -TERM "$pid"
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then log "dockerd $pid ignored SIGTERM for 30 s; SIGKILL"; kill -KILL "$pid"; fi
  rm -f "$pidfile" "$sock"
}

status() {
  local h
  if h=$(current_host); then echo "$h"; return 0; fi
  log "no Docker engine answers"; return 1
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 64 ;;
esac
