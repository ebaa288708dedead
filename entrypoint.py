#!/usr/bin/env python3
"""entrypoint.py - run `vllm serve` under a PID-1 supervisor that drains on SIGTERM and never hangs.

The image's ENTRYPOINT and the documented command; the code is the vllm_intel package
(vllm_intel/supervisor/), as installed: the image's wheel, a checkout's install, editable
(scripts/vllm-venv.sh) or not. `entrypoint.py --help` prints the usage, settings, shutdown timing
and exit codes, all rendered from vllm_intel/supervisor/settings.py.
"""

import _signal  # the C module: `import signal` builds enums for milliseconds, unprotected
import os
import sys

# `serve` (the default) holds the stop signals from its first line: the kernel drops a SIGTERM sent
# to PID 1 at its default action, never a blocked one (vllm_intel/supervisor/signals.py). The other
# subcommands hold SIGINT until their handler is in place (launch.main): one line, never a traceback.
if sys.argv[1:2] in ([], ["serve"]):
    _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGTERM, _signal.SIGINT})
else:
    _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT})

# The installed package first, this file's directory last: a checkout's vllm_intel/ lacks
# vllm_intel.patches (packaging maps patches/ to it), and vLLM's processes load the installed
# plugin. An editable install maps both names to the checkout; with none readable, the checkout's.
if sys.path and sys.path[0] == os.path.dirname(os.path.realpath(__file__)):
    sys.path.append(sys.path.pop(0))
try:
    from vllm_intel.supervisor.launch import main

    if sys.argv[1:2] in ([], ["serve"]):  # vLLM's processes load the plugin from the install
        import importlib.util

        if importlib.util.find_spec("vllm_intel.patches") is None:
            raise ModuleNotFoundError(name="vllm_intel.patches")
except ModuleNotFoundError as e:
    if not (e.name or "").startswith("vllm_intel"):
        raise
    # errors.Exit.NOT_FOUND, which cannot be imported: not installed for this python
    sys.stderr.write(
        f"entrypoint.py: the vllm-intel package is not installed for {sys.executable}"
        " (pip install . in the checkout)\n"
    )
    sys.exit(127)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
