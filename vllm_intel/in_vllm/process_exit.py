"""Exit vLLM's processes without CPython's finalization, once everything meant to run at exit ran.

Why: after its last ``atexit`` callback each vLLM process (worker, engine core, API server)
spends a part of its stop in interpreter finalization: clearing thousands of modules,
deallocating torch's objects, C++ static destructors (a process that imported torch and vLLM's
engine exits sooner with ``os._exit``; py-spy of a drained server showed each of the three in
that phase, with no Python frame, one after the other, since each parent waits for its child to
exit; the times: docs/bench.md, "Measured outside `make bench`", "`fast-exit`"). Nothing in it releases what another process or the
next server needs: shared memory, sockets and the distributed groups are released by vLLM's own
``shutdown()`` before, the operating system reclaims the rest.

``finish(code)`` keeps what an exiting interpreter does that matters and skips the rest:

* kept: joining non-daemon threads (``threading._shutdown``), every ``atexit`` callback
  (``logging.shutdown``, ``weakref.finalize`` objects, multiprocessing's finalizers), flushing
  Python's and C's standard streams, the exit status the interpreter would have used;
* skipped: module teardown, ``__del__`` of objects still alive, C++ static destructors.

It does so only where the ``fast-exit`` patch enabled it in this process (``ENABLED``: vLLM's
CPU platform); elsewhere it is ``sys.exit(code)``. Two ways in:

* the API server: the supervisor runs ``python -m vllm_intel.in_vllm.process_exit
  vllm.entrypoints.cli.main serve ...``, which runs vLLM's CLI as ``__main__`` (as ``-m`` would:
  ``sys.argv``, ``__main__`` and what spawned children re-import are the same) and then
  ``finish``; an exception other than ``SystemExit`` propagates as it would without us;
* spawned children (engine core, workers): the patch makes ``multiprocessing.spawn`` start them
  with ``spawn_main`` below, ``multiprocessing.spawn.spawn_main`` with ``finish`` in place of
  ``sys.exit``.

Standard library only: a spawned child imports this before anything else.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import runpy
import sys
import threading
from typing import NoReturn

ENABLED = False  # set by the fast-exit patch in this process

# multiprocessing.spawn.get_command_line's program, and ours.
STDLIB_PROGRAM = "from multiprocessing.spawn import spawn_main; spawn_main("
OUR_PROGRAM = "from vllm_intel.in_vllm.process_exit import spawn_main; spawn_main("


def exit_status(code: object) -> int:
    """The status CPython exits with for ``SystemExit(code)``; a non-int code is printed."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _flush_all() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or broken stream must not change the exit status
            pass
    try:  # what C code wrote with stdio (printf) and exit() would have flushed
        ctypes.CDLL(None).fflush(None)
    except Exception:
        pass


def finish(code: object = None) -> NoReturn:
    """Exit as ``sys.exit(code)`` would; without finalization when ``ENABLED``."""
    if not ENABLED:
        sys.exit(code)
    status = exit_status(code)
    threading._shutdown()  # type: ignore[attr-defined]  # what Py_Finalize does first
    atexit._run_exitfuncs()
    _flush_all()
    os._exit(status & 0xFF)


def spawn_main(pipe_handle, parent_pid=None, tracker_fd=None) -> NoReturn:
    """``multiprocessing.spawn.spawn_main`` (POSIX) ending in ``finish``."""
    from multiprocessing import resource_tracker, spawn

    assert spawn.is_forking(sys.argv), "Not forking"
    resource_tracker._resource_tracker._fd = tracker_fd
    parent_sentinel = os.dup(pipe_handle)
    finish(spawn._main(pipe_handle, parent_sentinel))


def run_module(name: str, args: list[str]) -> NoReturn:
    """``python -m NAME ARGS``, then ``finish``."""
    sys.argv = [name, *args]
    try:
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        finish(exc.code)
    finish(0)


def main() -> NoReturn:
    if len(sys.argv) < 2:
        print("usage: python -m vllm_intel.in_vllm.process_exit MODULE [ARG...]", file=sys.stderr)
        sys.exit(2)
    run_module(sys.argv[1], sys.argv[2:])


if __name__ == "__main__":
    # Through the package's module, not this __main__ copy: the patch sets ENABLED there.
    from vllm_intel.in_vllm.process_exit import main as _main

    _main()
