#!/usr/bin/env python3
"""entrypoint.py - run `vllm serve` under a PID-1 supervisor that drains on SIGTERM and never hangs.

The image's ENTRYPOINT and the documented command; the code is the vllm_intel package
(vllm_intel/supervisor/). `entrypoint.py --help` prints the usage, settings, shutdown timing and
exit codes, all rendered from vllm_intel/supervisor/settings.py.
"""

import _signal  # the C module: `import signal` builds enums for milliseconds, unprotected
import sys

# `serve` (the default) holds the stop signals from its first line: the kernel drops a SIGTERM sent
# to PID 1 at its default action, never a blocked one (vllm_intel/supervisor/signals.py). The other
# subcommands hold SIGINT until their handler is in place (launch.main): one line, never a traceback.
if sys.argv[1:2] in ([], ["serve"]):
    _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGTERM, _signal.SIGINT})
else:
    _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT})

import pathlib  # noqa: E402

# From a checkout, the checkout's package wins over an installed one (also under `python -I`,
# which drops the script's directory from sys.path).
_here = pathlib.Path(__file__).resolve().parent
if (_here / "vllm_intel" / "__init__.py").exists() and str(_here) not in sys.path:
    sys.path.insert(0, str(_here))

from vllm_intel.supervisor.launch import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
