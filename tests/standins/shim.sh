#!/bin/bash
# Command shims for running the XPU source route's install scripts where Intel's and GitHub's
# servers, Ubuntu's Python 3.12 and PyTorch's XPU index cannot be reached (tests only; installed
# by tests/standins/Dockerfile.shims as curl, apt-get, dpkg, pythonX.Y and the venv's pip).
# Each call is appended to $SHIM_LOG as one line: the command's name, then its arguments joined
# by a tab (pip also records VLLM_TARGET_DEVICE). What a call must produce for the script to go
# on is produced: the file curl is asked to write or pipes (a GPG key for .PUB and .key, a
# recording installer for .sh, a placeholder otherwise), a venv whose pip is this shim.
set -euo pipefail
log=${SHIM_LOG:-/var/log/vllm-intel-shims.log}
name=$(basename "$0")
record() { local IFS=$'\t'; echo "$name${1:+	}$*" >>"$log"; }
case "$name" in
  pip)
    record "$@" "VLLM_TARGET_DEVICE=${VLLM_TARGET_DEVICE:-}"
    # A requirements file goes with its build: record what it asks for.
    prev=""
    for a in "$@"; do
      if [ "$prev" = -r ]; then grep -vE '^\s*(#|$)' "$a" | sed 's/^/pip-requirement\t/' >>"$log"; fi
      prev=$a
    done ;;
  curl)
    record "$@"
    out="" url=""
    while [ $# -gt 0 ]; do
      case "$1" in -o) out=$2; shift ;; http*) url=$1 ;; esac
      shift
    done
    case "$url" in
      *.PUB|*.key) body() { cat /shims/intel-key.asc; } ;;
      *.sh) body() { printf '#!/bin/bash\necho "installer\t%s\t$*" >>%q\nmkdir -p /opt/intel/oneapi/ccl/2021.15\n' "$url" "$log"; } ;;
      *) body() { echo "placeholder for $url"; } ;;
    esac
    if [ -n "$out" ]; then body >"$out"; else body; fi ;;
  python3.*)
    record "$@"
    if [ "${1:-}" = -m ] && [ "${2:-}" = venv ]; then mkdir -p "$3/bin"; ln -sf /shims/shim "$3/bin/pip"; fi ;;
  *)
    record "$@" ;;
esac
