#!/usr/bin/env bash
# Create (once) and refresh the small venv holding the static-check tools of requirements-lint.txt,
# then print its path. `make lint` needs nothing else: no vLLM venv.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${VLLM_INTEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-intel}
venv="$cache/lint-venv"
mkdir -p "$cache"
exec 9>"$cache/.lock-lint"
flock 9
req_sum=$(sha256sum "$here/requirements-lint.txt" | cut -c1-16)
if [ "$(cat "$venv/.vllm-intel-req" 2>/dev/null)" != "$req_sum" ]; then
  [ -x "$venv/bin/pip" ] || "${PYTHON:-python3}" -m venv "$venv" >&2
  "$venv/bin/pip" install -q -r "$here/requirements-lint.txt" >&2
  echo "$req_sum" > "$venv/.vllm-intel-req"
fi
echo "$venv"
