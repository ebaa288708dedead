#!/bin/sh
# Install this project into /opt/venv as one wheel (the `vllm-intel` distribution: the supervisor
# and the patch plugin, one package vllm_intel), then check that vLLM sees the plugin. Shared by
# Dockerfile.cpu and Dockerfile.xpu.
#
#   install-app.sh SRC_DIR        (SRC_DIR holds pyproject.toml, vllm_intel/ and patches/: the
#                                  wheel's vllm_intel.patches, pyproject.toml's package-dir)
set -eu
src=$1
# A copy of the source: the bind mount is read-only and setuptools writes build/ and *.egg-info
# next to pyproject.toml. No deps: psutil and prometheus_client come with vLLM.
# The build backend (setuptools) comes from PyPI alone: upstream's XPU image sets
# PIP_EXTRA_INDEX_URL to PyTorch's XPU index, which pip would ask too (and retry where unreachable).
export PIP_EXTRA_INDEX_URL=
tmp=$(mktemp -d)
cp -r "$src/pyproject.toml" "$src/vllm_intel" "$src/patches" "$tmp/"
/opt/venv/bin/pip wheel --no-deps --no-cache-dir -w "$tmp/dist" "$tmp"
/opt/venv/bin/pip install --no-deps --no-cache-dir "$tmp"/dist/vllm_intel-*.whl
rm -rf "$tmp"
/opt/venv/bin/python - <<'PY'
import importlib.metadata as md
import vllm_intel.supervisor.cli  # noqa: F401  (the entrypoint's code is importable)
import vllm_intel.patches.registry  # noqa: F401  (the plugin: patches/ made it into the wheel)
eps = [e for e in md.entry_points(group="vllm.general_plugins") if e.name == "intel_patches"]
assert eps, "vllm-intel did not register its vllm.general_plugins entry point"
print("vllm-intel", md.version("vllm-intel"), "vllm", md.version("vllm"),
      "torch", md.version("torch"))
PY
