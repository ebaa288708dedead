#!/usr/bin/env bash
# Unpack (once) Debian's `prometheus` package into the cache and print its bin/ directory, which
# holds `prometheus` and `promtool`: the tests run a real Prometheus and check the alert rules
# with it. Unpacked, not installed: installing would start a system service on port 9090.
set -euo pipefail
cache=${VLLM_INTEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-intel}
mkdir -p "$cache/tools"
exec 9>"$cache/.lock-prometheus"
flock 9
found=$(find "$cache/tools" -maxdepth 4 -path '*/prometheus-*/usr/bin/promtool' 2>/dev/null | head -1)
if [ -n "$found" ]; then
  dirname "$found"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
if ! apt-get download prometheus >/dev/null 2>&1; then
  # A fresh machine may have no package lists yet (only root can fetch them).
  [ "$(id -u)" = 0 ] || { echo "prometheus-tools: apt-get download prometheus failed" >&2; exit 1; }
  apt-get update -qq >&2
  apt-get download prometheus >&2
fi
deb=$(ls prometheus_*.deb)
version=${deb#prometheus_}
version=${version%%_*}
dest="$cache/tools/prometheus-${version//[^A-Za-z0-9.+-]/_}"
dpkg-deb -x "$deb" "$work/root"
rm -rf "$dest"
mv "$work/root" "$dest"
"$dest/usr/bin/promtool" --version >&2
echo "$dest/usr/bin"
