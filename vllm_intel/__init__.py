"""vllm-intel: the PID-1 supervisor (vllm_intel.supervisor) and the vLLM patch plugin
(vllm_intel.patches). Importing this package imports neither of them."""
