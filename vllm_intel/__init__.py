"""vllm-intel: the PID-1 supervisor (vllm_intel.supervisor) and the vLLM patch plugin
(vllm_intel.patches). Importing this package imports neither of them."""

import pathlib as _pathlib
import sys as _sys

# Invariant: the plugin's source is the checkout's top-level patches/ and its import name is
# vllm_intel.patches everywhere (the entry point, the tests, vLLM's processes). A wheel installs it
# as vllm_intel/patches/ (package-dir in pyproject.toml): then plain imports find it and nothing
# below runs. In the checkout (no vllm_intel/patches/__init__.py, a ../patches/registry.py) one
# finder maps exactly the name vllm_intel.patches to ../patches/, whose __path__ then gives the
# submodules as usual; no other directory of the checkout becomes a vllm_intel.* module. It goes
# first on sys.meta_path: a leftover vllm_intel/patches/__pycache__ of an older checkout would
# otherwise be found as an empty namespace package. Lazy: nothing of the plugin is imported here.
_here = _pathlib.Path(__file__).resolve().parent
_source = _here.parent / "patches"
if not (_here / "patches" / "__init__.py").exists() and (_source / "registry.py").is_file():
    import importlib.util as _util

    class _SourcePatchesFinder:
        """sys.meta_path finder of the checkout: vllm_intel.patches is ../patches/."""

        @staticmethod
        def find_spec(fullname, path=None, target=None):
            if fullname != "vllm_intel.patches":
                return None
            return _util.spec_from_file_location(
                fullname, _source / "__init__.py", submodule_search_locations=[str(_source)]
            )

    _sys.meta_path.insert(0, _SourcePatchesFinder)
