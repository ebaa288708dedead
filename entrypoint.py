#!/usr/bin/env python3
"""entrypoint.py - run `vllm serve` under a PID-1 supervisor that drains on SIGTERM and never hangs.

The image's ENTRYPOINT and the documented command; the code is the vllm_intel package
(vllm_intel/supervisor/), as installed: the image's wheel, a checkout's editable install
(scripts/vllm-venv.sh). `entrypoint.py --help` prints the usage, settings, shutdown timing and
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

from vllm_intel.supervisor.launch import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
