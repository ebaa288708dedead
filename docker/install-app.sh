#!/bin/sh
# Install this project into /opt/venv: the patch plugin (the repository's pyproject.toml and
# patches/), then check that vLLM sees it. Shared by Dockerfile.cpu and Dockerfile.xpu.
#
#   install-app.sh SRC_DIR        (SRC_DIR holds pyproject.toml and patches/)
set -eu
src=$1
# Non-editable, no deps (the plugin has none): the source is a bind mount that is gone after RUN.
# A copy of the source: setuptools writes build/ and *.egg-info next to pyproject.toml.
tmp=$(mktemp -d)
cp -r "$src/pyproject.toml" "$src/patches" "$tmp/"
/opt/venv/bin/pip install --no-deps --no-cache-dir "$tmp"
rm -rf "$tmp"
/opt/venv/bin/python - <<'PY'
import importlib.metadata as md
eps = [e for e in md.entry_points(group="vllm.general_plugins") if e.name == "intel_patches"]
assert eps, "vllm-intel-patches did not register its vllm.general_plugins entry point"
print("plugin", md.version("vllm-intel-patches"), "vllm", md.version("vllm"),
      "torch", md.version("torch"))
PY
