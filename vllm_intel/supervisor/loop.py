"""The supervisor loop, as tini's main(): spawn, then wait -> forward -> reap -> check deadline.

Signals are blocked and collected synchronously with sigtimedwait: no handler does any work.
The loop does no HTTP (the observer thread does); its own I/O is the state file, and its
extensions' ticks return at once (the JSON relay reads only what vLLM's pipes hold).
"""

from __future__ import annotations

import ctypes
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from . import errors, timing
from .errors import Exit
from .extension import Extension
from .log import LAST_WAIT_S, log, lost_lines
from .observe import Observer
from .paths import StateFile
from .signals import FORWARDED, NOT_FORWARDED, STOPPING, WATCHED  # noqa: F401 (tests read them here)
from .state import State
from .timing import KILL_GRACE_S, ORPHAN_GRACE_S, TICK_S

PR_SET_CHILD_SUBREAPER = 36


LIBC = ctypes.CDLL(None, use_errno=True)


def prctl(option: int, arg: int) -> None:
    LIBC.prctl(option, arg, 0, 0, 0)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_SigSet = ctypes.c_byte * 128  # glibc's sigset_t: 1024 bits


def sigset(signals) -> _SigSet:
    s = _SigSet()
    LIBC.sigemptyset(ctypes.byref(s))
    for sig in signals:
        LIBC.sigaddset(ctypes.byref(s), int(sig))
    return s


def wait_signal(signals: _SigSet, timeout: float) -> int | None:
    """sigtimedwait(2): the blocked signal taken from `signals`, None on time-out or interruption.

    Not signal.sigtimedwait: when its time-out runs out after an EINTR, which a SIGSTOP + SIGCONT
    of the supervisor causes (`kill -STOP`, a debugger attaching), CPython returns the siginfo it
    never filled in (seen with 3.11; Modules/signalmodule.c, signal_sigtimedwait_impl: `break` out
    of the EINTR loop, then fill_siginfo(&si)): a random signal number, forwarded or acted on
    (tests/supervisor/test_signals.py). The syscall's own return value is the signal."""
    ts = _Timespec(int(timeout), int((timeout % 1) * 1e9))
    got = LIBC.sigtimedwait(ctypes.byref(signals), None, ctypes.byref(ts))
    return got if got > 0 else None


_WATCHED_SET = sigset(WATCHED)


# `spawn` runs after the probe and observer threads exist, where a preexec_fn is unsafe (a lock
# another thread held at fork stays held in the child forever: Python's docs on preexec_fn). So
# the child does its set-up in Python of its own: the interpreter fork+exec'd by Popen's safe
# path (no Python code between fork and exec) runs this, then execs vLLM in the same process (the
# pid the supervisor signals and reaps). Invariants:
# - signal dispositions: vLLM starts with every signal at its default action. exec resets caught
#   signals to SIG_DFL but keeps ignored ones, and this interpreter catches SIGINT and ignores
#   SIGPIPE and SIGXFSZ at start-up; a supervisor started under nohup, or as a background job of
#   a non-interactive shell, has SIGHUP, SIGINT, SIGQUIT ignored as well, and a forwarded signal
#   would then be lost on vLLM. All are set back to SIG_DFL before anything is unblocked.
# - the signal mask: the supervisor blocks WATCHED in every thread, and a mask survives fork and
#   exec, so it is inherited blocked and unblocked here, last before exec. A signal the supervisor
#   forwarded meanwhile was pending and takes its default action now, as it would on a vLLM that
#   had not yet installed its handlers.
# - PR_SET_PDEATHSIG SIGKILL (kept across exec; a parent already gone is checked after setting
#   it): if the supervisor itself is SIGKILLed (outside a container nothing else would stop vLLM),
#   the API server follows; the engine core follows the API server through the patch
#   engine-parent-watch (vLLM's does not), its workers the engine core through vLLM's death pipe
#   (tests/e2e/test_faults.py).
# - exec failures are reported through the pipe `errfd` (closed by the exec on success), as
#   Popen's own: spawn raises the OSError, and the supervisor exits CANNOT_EXEC as before.
_EXEC_CHILD = """\
import ctypes, os, signal, sys
errfd, ppid, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
try:
    for sig in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
        if signal.getsignal(sig) not in (signal.SIG_DFL, None):
            signal.signal(sig, signal.SIG_DFL)
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != ppid:
        os.kill(os.getpid(), signal.SIGKILL)
    os.set_inheritable(errfd, False)
except BaseException as e:
    os.write(errfd, f"setup:{type(e).__name__}: {e}".encode())
    os._exit(127)
signal.pthread_sigmask(signal.SIG_SETMASK, [])
try:
    os.execvp(argv[0], argv)
except OSError as e:
    os.write(errfd, f"exec:{e.errno}".encode())
os._exit(127)
"""


def exec_argv(argv: list[str], errfd: int) -> list[str]:
    """The argv that runs `argv` through _EXEC_CHILD (-I -S: none of vLLM's env or site-packages
    in the interpreter that only sets up and execs)."""
    return [sys.executable, "-I", "-S", "-c", _EXEC_CHILD, str(errfd), str(os.getpid()), *argv]


def popen_exec(
    argv: list[str],
    env: dict[str, str],
    output: tuple[int, int] | None = None,
) -> subprocess.Popen:
    """Popen of `argv` in a session of its own, set up by _EXEC_CHILD; returns once `argv` is
    executing. `output`: its stdout and stderr (None: ours). Raises OSError (it cannot be
    executed) or SubprocessError (the set-up failed)."""
    r, w = os.pipe()  # both close-on-exec; pass_fds hands `w` to the child only
    try:
        try:
            out, err_out = output or (None, None)
            child = subprocess.Popen(
                exec_argv(argv, w),
                env=env,
                start_new_session=True,
                pass_fds=(w,),
                stdout=out,
                stderr=err_out,
            )
        finally:
            os.close(w)
        with os.fdopen(r, "rb", closefd=False) as f:
            err = f.read()  # EOF: the exec succeeded (or the child died)
    finally:
        os.close(r)
    if not err:
        return child
    child.wait()
    stage, _, what = err.decode("utf-8", "replace").partition(":")
    if stage == "exec" and what.isdigit():
        raise OSError(int(what), os.strerror(int(what)), argv[0])
    raise subprocess.SubprocessError(f"the child's set-up failed: {what}")


class Supervisor:
    def __init__(self, cfg, state_path: pathlib.Path, extensions: Sequence[Extension] = ()):
        """cfg: the run's settings.ServeConfig."""
        self.argv, self.port, self.drain, self.url = cfg.argv, cfg.port, cfg.drain, cfg.url
        self.state_file = StateFile(state_path)  # its directory opened here, once
        self.state = State.STARTING
        self.child: subprocess.Popen | None = None
        self.returncode: int | None = None
        self.exited_at: float | None = None  # time.monotonic() when the API server was reaped
        self.started = time.monotonic()
        self.stop_requested_at: float | None = None
        self.exit_at: float | None = None  # every wait ends by then (timing.exit_by)
        self.was_serving = False  # at the stop request
        self.escalate_at: float | None = None
        self.kill_at: float | None = None
        self.escalated = False
        self.group_term_at: float | None = None  # a stop while starting: the group's SIGTERM
        self.observer = Observer(self.url, cfg.count_requests)
        self.extensions = tuple(extensions)  # what runs beside the loop (extension.py)

    # -- set up ---------------------------------------------------------------------------
    @staticmethod
    def block_signals() -> None:
        """Before any thread starts: every thread inherits the mask, so only sigtimedwait in
        the loop ever sees these signals."""
        try:  # as PID 1 (or anywhere): orphans of vLLM are re-parented to us, so we reap them
            prctl(PR_SET_CHILD_SUBREAPER, 1)
        except (OSError, AttributeError):
            pass
        signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)

    def write_state(self) -> None:
        data = {
            "state": self.state.value,
            "pid": os.getpid(),
            "port": self.port,
            "url": self.url,  # where `probe` asks vLLM's /health (host, https)
            "child": self.child.pid if self.child else None,
            "drain": self.drain,
        }
        try:
            self.state_file.write(json.dumps(data).encode())
        except OSError as e:
            log(f"cannot write state file {self.state_file.path}: {e}")

    def remove_state(self) -> None:
        """At exit: the state file goes only if it is still the file this run wrote."""
        self.state_file.remove()

    def set_state(self, state: State, why: str) -> None:
        self.state = state
        self.write_state()
        log(f"state {state.value}: {why}", event="state", state=state.value)
        for ext in self.extensions:
            ext.on_state(self)

    # -- spawn ----------------------------------------------------------------------------
    def spawn(
        self,
        env: dict[str, str],
        output: tuple[int, int] | None = None,
    ) -> int | None:
        try:
            self.child = popen_exec(self.argv, env, output)
        except (OSError, subprocess.SubprocessError) as e:  # the latter: the set-up failed
            log(f"cannot execute {self.argv[0]}: {e}")
            return Exit.CANNOT_EXEC
        self.set_state(
            State.STARTING,
            f"vllm serve pid {self.child.pid}, {self.url}, drain {self.drain} s, "
            f"deadline {timing.deadline(self.drain)} s after SIGTERM",
        )
        self.observer.start()
        for ext in self.extensions:
            ext.on_spawn(self)
        return None

    # -- the loop: wait -> forward -> reap -> deadline ------------------------------------
    def run(self) -> int:
        while self.returncode is None:
            sig = wait_signal(_WATCHED_SET, TICK_S)  # wait
            if sig is not None:
                self.on_signal(sig)  # forward
            self.reap()
            self.check_deadline()
            self.check_ready()
            self.tick_extensions()
        return self.finish()

    def tick_extensions(self) -> None:
        for ext in self.extensions:
            ext.on_tick(self)

    def on_signal(self, sig: int) -> None:
        if sig == signal.SIGCHLD:
            return
        if sig not in STOPPING:
            self.signal_child(sig)
        elif self.stop_requested_at is None:
            self.begin_drain(sig)
        elif not self.escalated:
            log(f"second {signal.Signals(sig).name}: stopping now")
            self.escalate(time.monotonic())

    def begin_drain(self, sig: int) -> None:
        now = time.monotonic()
        # First: only the API server, which orders the engine's drain (signalling the group
        # would cut it). Everything else (state file, log, counting requests) comes after.
        self.signal_child(signal.SIGTERM)
        self.check_ready()  # the observer may have seen vLLM ready since the loop last looked
        self.stop_requested_at = now
        self.kill_at = now + timing.deadline(self.drain)
        self.escalate_at = self.kill_at - KILL_GRACE_S
        self.exit_at = now + timing.exit_by(self.drain)
        self.was_serving = self.state == State.SERVING
        if self.state == State.STARTING:
            # Nothing was accepted yet, so nothing to drain; vLLM may not act on SIGTERM until
            # its engine is up (its API server waits for the engine core's handshake).
            self.group_term_at = now + KILL_GRACE_S
        self.observer.begin_drain(serving=self.state == State.SERVING)
        self.set_state(
            State.DRAINING,
            f"{signal.Signals(sig).name} received, forwarded to vLLM; drain window "
            f"{self.drain} s, hard deadline {timing.deadline(self.drain)} s",
        )

    def escalate(self, now: float) -> None:
        self.escalated = True
        self.kill_at = min(self.kill_at or now + KILL_GRACE_S, now + KILL_GRACE_S)
        self.signal_group(signal.SIGTERM)
        self.set_state(
            State.KILLING,
            f"SIGTERM to process group, SIGKILL in {max(self.kill_at - now, 0):.0f} s",
        )

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.child and pid == self.child.pid:
                self.returncode = self.child.returncode = os.waitstatus_to_exitcode(status)
                self.exited_at = time.monotonic()

    def check_deadline(self) -> None:
        now = time.monotonic()
        if self.group_term_at is not None and now >= self.group_term_at and not self.escalated:
            if self.observer.answering.is_set():
                log("vLLM was serving when the stop came (ready since the last check): it drains")
            else:
                log(
                    "vLLM did not stop while starting: SIGTERM to its process group (nothing to drain)"
                )
                self.signal_group(signal.SIGTERM)
            self.group_term_at = None
        if self.escalate_at is not None and now >= self.escalate_at and not self.escalated:
            log(
                f"deadline: vLLM did not exit {self.escalate_at - self.stop_requested_at:.0f} s "
                "after SIGTERM"
            )
            self.escalate(now)
        if self.kill_at is not None and self.escalated and now >= self.kill_at:
            self.signal_group(signal.SIGKILL)
            self.kill_at = None

    def check_ready(self) -> None:
        if self.state == State.STARTING and self.observer.ready.is_set():
            took = time.monotonic() - self.started
            said = "".join(ext.ready_words(self) for ext in self.extensions)
            self.set_state(State.SERVING, f"ready after {took:.1f} s{said}")

    # -- exit -----------------------------------------------------------------------------
    def signal_child(self, sig: int) -> None:
        if self.child and self.returncode is None:
            try:
                os.kill(self.child.pid, sig)
            except ProcessLookupError:
                pass

    def signal_group(self, sig: int) -> None:
        if self.child:
            try:
                os.killpg(self.child.pid, sig)
            except ProcessLookupError:
                pass

    def group_alive(self) -> bool:
        try:
            os.killpg(self.child.pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def finish(self) -> int:
        self.observer.stop()
        code = errors.exit_code(
            self.returncode,
            stop_requested=self.stop_requested_at is not None,
            escalated=self.escalated,
        )
        # multiprocessing's resource tracker exits by itself right after the API server (and
        # unlinks what vLLM leaked); anything still there after ORPHAN_GRACE_S is an orphan.
        self.wait_group(self.time_left(0 if self.escalated else ORPHAN_GRACE_S))
        if self.group_alive():
            log("vLLM's API server is gone but its engine or workers are not: killing the group")
            self.signal_group(signal.SIGKILL)
            self.wait_group(self.time_left(5))
        for ext in self.extensions:  # e.g. vLLM's processes that left its group
            ext.on_group_gone(self)
        reap_all()
        self.tick_extensions()  # e.g. the relay: vLLM's last lines before the exit line
        log(self.summary(code), event="exit", code=int(code), wait=self.time_left(LAST_WAIT_S))
        return code

    def time_left(self, seconds: float) -> float:
        """`seconds`, cut to what is left before exit_at. Invariant: after a stop request every
        wait of the supervisor (these, the linger, the relay's last lines) ends by exit_at, so the
        orchestrator's SIGKILL at the end of the grace period never comes first."""
        if self.exit_at is None:
            return seconds
        return max(min(seconds, self.exit_at - time.monotonic()), 0.0)

    def exit_extensions(self) -> None:
        for ext in self.extensions:
            ext.on_exit(self)

    def linger(self, seconds: float) -> None:
        """After vLLM's exit, wait `seconds` (an extension's last word, e.g. a last scrape of the
        probe port's /metrics); a signal ends it at once."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            sig = wait_signal(_WATCHED_SET, left)
            if sig is not None and sig != signal.SIGCHLD:
                return

    def wait_group(self, seconds: float) -> None:
        """Until vLLM's process group is gone or `seconds` pass; the extensions tick meanwhile."""
        end = time.monotonic() + seconds
        tick_at = 0.0
        while self.group_alive() and (now := time.monotonic()) < end:
            reap_all()
            if now >= tick_at:
                self.tick_extensions()
                tick_at = now + TICK_S
            time.sleep(0.01)  # a signal-0 probe and a reap: cheap, and the container's exit waits

    def summary(self, code: int) -> str:
        rc = self.returncode
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with {rc}"
        said = "".join(ext.exit_words(self) for ext in self.extensions) + lost_lines()
        if self.stop_requested_at is None:
            return f"exit {code}: vLLM {how} without a stop request" + said
        took = time.monotonic() - self.stop_requested_at
        return f"exit {code}: vLLM {how} {took:.1f} s after the stop request" + said


def reap_all() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
