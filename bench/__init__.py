"""`make bench` (python -m bench): side-by-side ratios of vllm-intel against the alternatives."""
