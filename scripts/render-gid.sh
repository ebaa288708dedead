#!/usr/bin/env bash
# The host's render group id for the vllm-xpu compose service (docs/deploy.md, "XPU").
#
#   scripts/render-gid.sh               (= make xpu-env) write INTEL_VLLM_RENDER_GID=<group of the
#                                       host's /dev/dri/renderD*> into .env (made from .env.example
#                                       if there is none)
#   scripts/render-gid.sh check VALUE   exit 0 if VALUE is a numeric gid; scripts/compose.sh runs it
#                                       before anything starts vllm-xpu
#
# Why a number: Docker looks group_add names up in the container's /etc/group, which has no render
# group (and a group of that name there would not have the host's gid).
# Exit codes, each with a one-line message on stderr:
#   64  INTEL_VLLM_RENDER_GID missing or not a number, or a usage error
#   65  the render nodes belong to different groups: set INTEL_VLLM_RENDER_GID by hand
#   66  no render node: no GPU kernel driver (i915/xe) loaded, or not the GPU host
# Settings (tests, unusual hosts): INTEL_VLLM_DRI_DIR (/dev/dri), INTEL_VLLM_ENV_FILE (./.env).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dri=${INTEL_VLLM_DRI_DIR:-/dev/dri}
envfile=${INTEL_VLLM_ENV_FILE:-$here/.env}

die() { echo "render-gid: $2" >&2; exit "$1"; }

check() {
  [ -n "$1" ] || die 64 "INTEL_VLLM_RENDER_GID is not set: run \`make xpu-env\` on the GPU host (it writes the gid of /dev/dri/renderD* into .env)"
  [[ $1 =~ ^[0-9]+$ ]] || die 64 "INTEL_VLLM_RENDER_GID=$1 is not a numeric gid (Docker looks names up in the container, not the host): run \`make xpu-env\`"
}

case "${1:-}" in
  check) check "${2:-}"; exit 0 ;;
  "") ;;
  *) die 64 "usage: scripts/render-gid.sh [check VALUE]" ;;
esac

shopt -s nullglob
nodes=("$dri"/renderD*)
[ ${#nodes[@]} -gt 0 ] || die 66 "no $dri/renderD*: no Intel GPU kernel driver (i915/xe) loaded, or this is not the GPU host"
mapfile -t gids < <(stat -c %g "${nodes[@]}" | sort -u)
[ ${#gids[@]} -eq 1 ] \
  || die 65 "the render nodes in $dri belong to different groups (${gids[*]}): set INTEL_VLLM_RENDER_GID in $envfile by hand"
gid=${gids[0]}
check "$gid"
[ -d "$dri/by-path" ] || echo "render-gid: warning: no $dri/by-path (udev): Docker will create it empty on the host;" \
  "the GPU driver and oneCCL then find no device by PCI path in the container" >&2

[ -e "$envfile" ] || cp "$here/.env.example" "$envfile"
line="^[[:space:]]*(export[[:space:]]+)?INTEL_VLLM_RENDER_GID="
if grep -Eq "$line" "$envfile"; then
  sed -Ei --follow-symlinks "s/$line.*/INTEL_VLLM_RENDER_GID=$gid/" "$envfile"
else
  echo "INTEL_VLLM_RENDER_GID=$gid" >>"$envfile"
fi
echo "render-gid: INTEL_VLLM_RENDER_GID=$gid (group of ${nodes[*]}) written to $envfile" >&2
