"""vllm-intel: the PID-1 supervisor (vllm_intel.supervisor) and the vLLM patch plugin
(vllm_intel.patches). Importing this package imports neither of them.

The plugin's source is the checkout's top-level patches/; packaging alone names it
vllm_intel.patches (pyproject.toml's package-dir): a wheel holds it as vllm_intel/patches/, an
editable install of a checkout (scripts/vllm-venv.sh) maps the name to the checkout's patches/."""
