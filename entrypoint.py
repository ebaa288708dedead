#!/usr/bin/env python3
"""entrypoint.py - run `vllm serve` under a PID-1 supervisor that drains on SIGTERM and never hangs.

Usage:
  entrypoint.py                          serve the built-in model ($INTEL_VLLM_MODEL)
  entrypoint.py serve [MODEL] [FLAGS]    `vllm serve MODEL FLAGS`, flags passed through untouched
  entrypoint.py patches [FLAGS]          print the patch table (name, state, reason)
  entrypoint.py probe ready|live [--port N]   exit 0/1, for healthchecks and Kubernetes probes
  entrypoint.py grace-period             print the orchestrator grace period (seconds)

Shutdown timing (docs/CONVENTIONS.md holds the same formula for compose and Kubernetes):
  DRAIN    = $INTEL_VLLM_DRAIN_TIMEOUT (default 30 s; on XPU at least 5 s), passed to vLLM as
             --shutdown-timeout unless the user gave one (then that value is DRAIN)
  deadline = DRAIN + TEARDOWN (10 s) after the first SIGTERM: the whole process group is
             SIGTERMed KILL_GRACE (3 s) before it and SIGKILLed at it
  grace    = DRAIN + TEARDOWN + MARGIN (5 s): what compose stop_grace_period and Kubernetes
             terminationGracePeriodSeconds (plus any preStop sleep) must at least allow

Exit codes:
  vLLM's own  vLLM exited after a stop request (0 after a clean drain)
  128+N       vLLM died of signal N
  64          configuration error, nothing started
  70          vLLM exited without being asked to (even with code 0), e.g. its engine died
  124         forced kill: the deadline (or a second signal) made us kill the process group
  126         vLLM could not be executed
  127         vLLM is not installed

The supervisor follows tini's main(): set up, spawn, then one loop
wait (sigtimedwait) -> forward -> reap -> check deadline. Signals are blocked and collected
synchronously, so there are no handlers doing work. It imports neither torch nor vLLM.
"""

from __future__ import annotations

import ctypes
import enum
import importlib.util
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

EXIT_CONFIG = 64
EXIT_UNEXPECTED = 70
EXIT_FORCED = 124
EXIT_CANNOT_EXEC = 126
EXIT_NOT_FOUND = 127

DEFAULT_DRAIN_S = 30
XPU_MIN_DRAIN_S = 5
TEARDOWN_S = 10
MARGIN_S = 5
KILL_GRACE_S = 3
ORPHAN_GRACE_S = 2  # after the API server exits, before what is left of its group is SIGKILLed
DEFAULT_PORT = 8000
TICK_S = 0.5
HEALTH_TIMEOUT_S = 2.0  # a loaded host can take over a second to answer /health while starting
COUNT_POLL_S = TICK_S  # /metrics while draining: the last sample must follow the last stream

HERE = pathlib.Path(__file__).resolve().parent
BUILTIN_MODELS = (
    pathlib.Path("/opt/vllm-intel/models/tiny-llama"),  # inside the images
    HERE / "build" / "tiny-llama",  # a checkout after `make setup`
)
FORWARDED = (signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH)
STOPPING = (signal.SIGTERM, signal.SIGINT)
WATCHED = set(FORWARDED) | set(STOPPING) | {signal.SIGCHLD}
# Names vLLM (multiprocessing) gives its shared memory segments and semaphores in /dev/shm.
SHM_PATTERNS = (re.compile(r"^psm_[0-9a-f]+$"), re.compile(r"^sem\.mp-\w+$"), re.compile(r"^wnsm_\w+$"))
RUN_DIR_PREFIX = "vllm-intel-run-"
# vLLM binds ZeroMQ ipc sockets named by a uuid in the run dir; a unix socket path has 107 bytes.
MAX_TMPDIR_LEN = 107 - len(RUN_DIR_PREFIX) - 8 - 2 - 36


class ConfigError(Exception):
    """Bad input: reported as one line, exit 64, nothing started."""


class State(enum.Enum):
    STARTING = "STARTING"
    SERVING = "SERVING"
    DRAINING = "DRAINING"
    KILLING = "KILLING"


def log(msg: str) -> None:
    print(f"[entrypoint] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------- config

def device() -> str:
    dev = os.environ.get("INTEL_VLLM_DEVICE") or os.environ.get("VLLM_TARGET_DEVICE") or "cpu"
    if dev not in ("cpu", "xpu"):
        raise ConfigError(f"INTEL_VLLM_DEVICE must be cpu or xpu, not {dev!r}")
    return dev


def parse_seconds(name: str, value: str) -> int:
    if not re.fullmatch(r"\s*\d+\s*", value or ""):
        raise ConfigError(f"{name} must be a whole number of seconds >= 0, not {value!r}")
    return int(value)


def flag_value(flags: list[str], name: str) -> str | None:
    """Value of `--name V` or `--name=V` in vLLM flags (last one wins, as argparse does)."""
    found = None
    for i, arg in enumerate(flags):
        if arg == name:
            if i + 1 >= len(flags):
                raise ConfigError(f"{name} needs a value")
            found = flags[i + 1]
        elif arg.startswith(name + "="):
            found = arg.split("=", 1)[1]
    return found


def drain_seconds(flags: list[str] | None = None) -> tuple[int, list[str]]:
    """DRAIN and the notes explaining how it was chosen."""
    notes = []
    user = flag_value(flags or [], "--shutdown-timeout")
    if user is not None:
        drain = parse_seconds("--shutdown-timeout", user)
    else:
        drain = parse_seconds("INTEL_VLLM_DRAIN_TIMEOUT",
                              os.environ.get("INTEL_VLLM_DRAIN_TIMEOUT", str(DEFAULT_DRAIN_S)))
    if device() == "xpu" and drain < XPU_MIN_DRAIN_S:
        notes.append(f"drain raised from {drain} s to {XPU_MIN_DRAIN_S} s: XPU workers need it "
                     "to release Level Zero / oneCCL resources")
        drain = XPU_MIN_DRAIN_S
    return drain, notes


def grace_period(drain: int) -> int:
    return drain + TEARDOWN_S + MARGIN_S


def state_file(port: int) -> pathlib.Path:
    explicit = os.environ.get("INTEL_VLLM_STATE_FILE")
    if explicit:
        return pathlib.Path(explicit)
    return pathlib.Path(tempfile.gettempdir()) / f"vllm-intel-{port}.state.json"


def looks_like_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~"))


def serve_command(args: list[str]) -> tuple[list[str], int, int]:
    """Build `vllm serve` argv; returns (argv, port, drain). Raises ConfigError."""
    flags = list(args)
    if flags and not flags[0].startswith("-"):
        model = flags.pop(0)
    elif flag_value(flags, "--model") is not None:
        model = None  # the user named it with --model
    else:
        model = os.environ.get("INTEL_VLLM_MODEL") or next(
            (str(p) for p in BUILTIN_MODELS if (p / "config.json").exists()), None)
        if model is None:
            raise ConfigError("no model given and the built-in model is missing "
                              "(set INTEL_VLLM_MODEL, pass a model, or run `make setup`)")
    for name in filter(None, [model, flag_value(flags, "--model")]):
        if looks_like_path(name) and not pathlib.Path(name).expanduser().exists():
            raise ConfigError(f"model path {name} does not exist")
    port_s = flag_value(flags, "--port")
    port = parse_seconds("--port", port_s) if port_s is not None else DEFAULT_PORT
    drain, notes = drain_seconds(flags)
    for note in notes:
        log(note)
    if flag_value(flags, "--shutdown-timeout") is None or notes:
        flags = [f for i, f in enumerate(flags)
                 if not (f.startswith("--shutdown-timeout") or
                         (i and flags[i - 1] == "--shutdown-timeout"))]
        flags += ["--shutdown-timeout", str(drain)]
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
    return argv + ([model] if model else []) + flags, port, drain


# ---------------------------------------------------------------------------------- http

def http_get(port: int, path: str, timeout: float = 0.5) -> tuple[int, str]:
    """(status, body) of GET http://127.0.0.1:port/path; (0, error) if it cannot connect."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (OSError, ValueError) as e:
        return 0, str(e)


def request_counts(port: int) -> dict[str, float] | None:
    """In-flight and finished counts from vLLM's Prometheus metrics (None if unreachable)."""
    status, body = http_get(port, "/metrics", timeout=1.0)
    if status != 200:
        return None
    counts = {"running": 0.0, "waiting": 0.0, "finished": 0.0, "aborted": 0.0}
    for line in body.splitlines():
        m = re.match(r'^vllm:(num_requests_running|num_requests_waiting|request_success_total)'
                     r'(\{[^}]*\})?\s+([0-9.eE+-]+)$', line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name == "num_requests_running":
            counts["running"] += value
        elif name == "num_requests_waiting":
            counts["waiting"] += value
        elif 'finished_reason="abort"' in labels:
            counts["aborted"] += value
        else:
            counts["finished"] += value
    return counts


# ---------------------------------------------------------------------------------- leftovers

def _files_in_use() -> set[tuple[int, int]]:
    """(st_dev, st_ino) of every file some live process has mapped or open.

    By inode, not by path: glibc's sem_open() creates a temporary `sem.XXXXXX`, maps it, links
    it to its final name and unlinks the temporary one, so /proc/PID/maps names a deleted file
    for every live semaphore."""
    used = set()
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[4] != "0":
                    major, minor = (int(x, 16) for x in parts[3].split(":"))
                    used.add((os.makedev(major, minor), int(parts[4])))
            for fd in (proc / "fd").iterdir():
                try:
                    st = os.stat(fd)
                    used.add((st.st_dev, st.st_ino))
                except OSError:
                    pass
        except OSError:
            continue
    return used


def process_identity(pid: int) -> str:
    """"PID STARTTIME": tells a live process from a later one that reuses its pid (in a restarted
    container the supervisor is PID 1 every time)."""
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    return f"{pid} {stat.rsplit(')', 1)[1].split()[19]}"


def remove_stale(shm_dir: pathlib.Path, tmp_dir: pathlib.Path, only: set[str] | None = None) -> list[str]:
    """Remove vLLM shm segments and run directories that no live process uses.

    `only` limits the shm candidates (at exit: the segments created during this run)."""
    # List first, then look at what is in use: a segment or semaphore is mapped (or open) before
    # its name appears, so one created between the two steps is never taken for stale.
    candidates = [entry for entry in (sorted(shm_dir.iterdir()) if shm_dir.is_dir() else [])
                  if (only is None or entry.name in only)
                  and any(p.match(entry.name) for p in SHM_PATTERNS)]
    in_use = _files_in_use()
    removed = []
    for entry in candidates:
        try:
            st = entry.stat()
            if (st.st_dev, st.st_ino) not in in_use:
                entry.unlink()
                removed.append(str(entry))
        except OSError:
            pass
    for run_dir in sorted(tmp_dir.glob(RUN_DIR_PREFIX + "*")) if only is None else []:
        try:
            pid_s, _, started = (run_dir / "supervisor.pid").read_text().partition(" ")
            if process_identity(int(pid_s)) == f"{pid_s} {started}":
                continue  # its supervisor is alive (same pid *and* start time: not a reused pid)
        except (OSError, ValueError):
            pass  # no such process, or no readable pid: stale
        shutil.rmtree(run_dir, ignore_errors=True)
        removed.append(str(run_dir))
    return removed


# ---------------------------------------------------------------------------------- supervisor

class Supervisor:
    def __init__(self, argv: list[str], port: int, drain: int):
        self.argv, self.port, self.drain = argv, port, drain
        self.state = State.STARTING
        self.child: subprocess.Popen | None = None
        self.status: int | None = None  # raw wait status of the child
        self.started = time.monotonic()
        self.stop_requested_at: float | None = None
        self.escalate_at: float | None = None
        self.kill_at: float | None = None
        self.escalated = False
        self.counts_at_drain: dict[str, float] | None = None
        self.last_counts: dict[str, float] | None = None
        self.next_count_poll = 0.0
        self.state_path = state_file(port)
        self.run_dir: pathlib.Path | None = None
        self.shm_dir = pathlib.Path(os.environ.get("INTEL_VLLM_SHM_DIR", "/dev/shm"))
        self.shm_before: set[str] = set()

    # -- set up ---------------------------------------------------------------
    def setup(self) -> dict[str, str]:
        tmp = pathlib.Path(tempfile.gettempdir())
        stale = remove_stale(self.shm_dir, tmp)
        if stale:
            log(f"removed {len(stale)} stale leftover(s) of an earlier run: {' '.join(stale)}")
        self.run_dir = pathlib.Path(tempfile.mkdtemp(prefix=RUN_DIR_PREFIX, dir=tmp))
        (self.run_dir / "supervisor.pid").write_text(process_identity(os.getpid()))
        self.shm_before = set(os.listdir(self.shm_dir)) if self.shm_dir.is_dir() else set()
        env = dict(os.environ)
        # vLLM's sockets, inductor's scratch files and vllm_dist_* files land here and go with it.
        env["TMPDIR"] = str(self.run_dir)
        env["VLLM_RPC_BASE_PATH"] = str(self.run_dir)
        # Keep compiled kernels across runs (a warm start is ~15 s faster); it is a cache, not litter.
        cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "vllm-intel" / "torchinductor"))
        # As PID 1 (or anywhere): orphans of vLLM are re-parented to us, so we reap them.
        try:
            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        except (OSError, AttributeError):
            pass
        signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
        return env

    def write_state(self) -> None:
        data = {"state": self.state.value, "pid": os.getpid(), "port": self.port,
                "child": self.child.pid if self.child else None, "drain": self.drain}
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data))
            tmp.replace(self.state_path)
        except OSError as e:
            log(f"cannot write state file {self.state_path}: {e}")

    def set_state(self, state: State, why: str) -> None:
        self.state = state
        self.write_state()
        log(f"state {state.value}: {why}")

    # -- spawn ----------------------------------------------------------------
    def spawn(self, env: dict[str, str]) -> int | None:
        def child_setup() -> None:  # runs in the child between fork and exec
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            # If the supervisor itself is SIGKILLed (outside a container nothing else would
            # stop vLLM), the API server follows; its engine and workers watch their parent.
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG

        try:
            self.child = subprocess.Popen(self.argv, env=env, start_new_session=True,
                                          preexec_fn=child_setup)
        except OSError as e:
            log(f"cannot execute {self.argv[0]}: {e}")
            return EXIT_CANNOT_EXEC
        self.set_state(State.STARTING,
                       f"vllm serve pid {self.child.pid}, port {self.port}, drain {self.drain} s, "
                       f"deadline {self.drain + TEARDOWN_S} s after SIGTERM")
        return None

    # -- the loop: wait -> forward -> reap -> deadline ----------------------------
    def run(self) -> int:
        while self.status is None:
            info = signal.sigtimedwait(WATCHED, TICK_S)  # wait
            if info is not None:
                self.forward(info.si_signo)
            self.reap()
            self.check_deadline()
            self.observe()
        return self.finish()

    def forward(self, sig: int) -> None:
        if sig == signal.SIGCHLD:
            return
        if sig in STOPPING:
            if self.stop_requested_at is None:
                self.begin_drain(sig)
            elif not self.escalated:
                log(f"second {signal.Signals(sig).name}: stopping now")
                self.escalate(time.monotonic())
            return
        self.signal_child(sig)

    def begin_drain(self, sig: int) -> None:
        now = time.monotonic()
        self.stop_requested_at = now
        self.kill_at = now + self.drain + TEARDOWN_S
        self.escalate_at = self.kill_at - KILL_GRACE_S
        self.counts_at_drain = request_counts(self.port) if self.state == State.SERVING else None
        inflight = ("unknown" if self.counts_at_drain is None else
                    int(self.counts_at_drain["running"] + self.counts_at_drain["waiting"]))
        self.set_state(State.DRAINING,
                       f"{signal.Signals(sig).name} received; {inflight} request(s) in flight; "
                       f"drain window {self.drain} s, hard deadline {self.drain + TEARDOWN_S} s")
        # Only the API server: it orders the engine's drain; signalling the group would cut it.
        self.signal_child(signal.SIGTERM)

    def escalate(self, now: float) -> None:
        self.escalated = True
        self.kill_at = min(self.kill_at or now + KILL_GRACE_S, now + KILL_GRACE_S)
        self.set_state(State.KILLING, f"SIGTERM to process group, SIGKILL in "
                                      f"{max(self.kill_at - now, 0):.0f} s")
        self.signal_group(signal.SIGTERM)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.child and pid == self.child.pid:
                self.status = status
                self.child.returncode = os.waitstatus_to_exitcode(status)

    def check_deadline(self) -> None:
        now = time.monotonic()
        if self.escalate_at is not None and now >= self.escalate_at and not self.escalated:
            log(f"deadline: vLLM did not exit {self.escalate_at - self.stop_requested_at:.0f} s "
                "after SIGTERM")
            self.escalate(now)
        if self.kill_at is not None and self.escalated and now >= self.kill_at:
            self.signal_group(signal.SIGKILL)
            self.kill_at = None

    def observe(self) -> None:
        """Readiness while starting; request counts while draining (for the exit log)."""
        if self.state == State.STARTING and self.stop_requested_at is None:
            if http_get(self.port, "/health", timeout=HEALTH_TIMEOUT_S)[0] == 200:
                self.set_state(State.SERVING, f"ready after {time.monotonic() - self.started:.1f} s")
        elif self.state == State.DRAINING and time.monotonic() >= self.next_count_poll:
            self.next_count_poll = time.monotonic() + COUNT_POLL_S
            self.last_counts = request_counts(self.port) or self.last_counts

    # -- exit -----------------------------------------------------------------
    def signal_child(self, sig: int) -> None:
        if self.child and self.status is None:
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
        code = self.exit_code()
        # multiprocessing's resource tracker exits by itself right after the API server (and
        # unlinks what vLLM leaked); anything still there after ORPHAN_GRACE_S is an orphan.
        self.wait_group(0 if self.escalated else ORPHAN_GRACE_S)
        if self.group_alive():
            log("vLLM's API server is gone but its engine or workers are not: killing the group")
            self.signal_group(signal.SIGKILL)
            self.wait_group(5)
        self.reap_all()
        self.cleanup()
        log(self.summary(code))
        return code

    def wait_group(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self.group_alive() and time.monotonic() < end:
            self.reap_all()
            time.sleep(0.05)

    def reap_all(self) -> None:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass

    def exit_code(self) -> int:
        rc = self.child.returncode
        if self.escalated and rc != 0:
            return EXIT_FORCED
        if rc < 0:
            return 128 - rc
        if self.stop_requested_at is None:
            return EXIT_UNEXPECTED if rc == 0 else rc
        return rc

    def summary(self, code: int) -> str:
        rc = self.child.returncode
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with {rc}"
        if self.stop_requested_at is None:
            return f"exit {code}: vLLM {how} without a stop request"
        took = time.monotonic() - self.stop_requested_at
        counts = ""
        if self.counts_at_drain is not None:
            inflight = int(self.counts_at_drain["running"] + self.counts_at_drain["waiting"])
            last = self.last_counts or self.counts_at_drain
            finished = int(last["finished"] - self.counts_at_drain["finished"])
            aborted = int(last["aborted"] - self.counts_at_drain["aborted"])
            running = int(last["running"] + last["waiting"])
            counts = (f"; {inflight} in flight at SIGTERM, {finished} finished, {aborted} aborted"
                      + (f", {running} still running" if running else "")
                      + " (as last seen in /metrics)")
        return f"exit {code}: vLLM {how} {took:.1f} s after the stop request{counts}"

    def cleanup(self) -> None:
        new = set(os.listdir(self.shm_dir)) - self.shm_before if self.shm_dir.is_dir() else set()
        removed = remove_stale(self.shm_dir, pathlib.Path(tempfile.gettempdir()), only=new)
        if removed:
            log(f"removed {len(removed)} shared memory leftover(s) of this run")
        if self.run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        try:
            self.state_path.unlink()
        except OSError:
            pass


def serve(args: list[str]) -> int:
    argv, port, drain = serve_command(args)
    if importlib.util.find_spec("vllm") is None:
        log(f"vLLM is not installed for {sys.executable}")
        return EXIT_NOT_FOUND
    tmp = tempfile.gettempdir()
    if len(tmp) > MAX_TMPDIR_LEN:
        raise ConfigError(f"TMPDIR {tmp} is longer than {MAX_TMPDIR_LEN} characters: vLLM's IPC "
                          "socket paths inside it would not fit a unix socket address")
    sup = Supervisor(argv, port, drain)
    env = sup.setup()
    failed = sup.spawn(env)
    if failed is not None:
        sup.cleanup()
        return failed
    return sup.run()


# ---------------------------------------------------------------------------------- probes

def probe(args: list[str]) -> int:
    if not args or args[0] not in ("ready", "live"):
        raise ConfigError("probe takes `ready` or `live`")
    port_s = flag_value(args[1:], "--port")
    port = parse_seconds("--port", port_s) if port_s else int(
        os.environ.get("INTEL_VLLM_PORT", DEFAULT_PORT))
    try:
        data = json.loads(state_file(port).read_text())
        os.kill(int(data["pid"]), 0)
    except (OSError, ValueError, KeyError):
        print(f"not {args[0]}: no running supervisor for port {port}")
        return 1
    state = data["state"]
    healthy = http_get(port, "/health", timeout=2.0)[0] == 200
    if args[0] == "ready":
        ok = state == State.SERVING.value and healthy
    else:  # live: still loading, or the server answers
        ok = state == State.STARTING.value or (state in (State.SERVING.value,
                                                          State.DRAINING.value) and healthy)
    print(f"{'' if ok else 'not '}{args[0]}: state {state}, /health {'ok' if healthy else 'failing'}")
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    cmd, rest = (argv[0], argv[1:]) if argv else ("serve", [])
    try:
        if cmd == "serve":
            return serve(rest)
        if cmd == "patches":
            if importlib.util.find_spec("vllm_intel_patches") is None:
                log(f"the patch plugin is not installed for {sys.executable}")
                return EXIT_NOT_FOUND
            import vllm_intel_patches
            return vllm_intel_patches.main(rest)
        if cmd == "probe":
            return probe(rest)
        if cmd == "grace-period":
            print(grace_period(drain_seconds()[0]))
            return 0
        if cmd in ("-h", "--help", "help"):
            print(__doc__)
            return 0
        raise ConfigError(f"unknown subcommand {cmd!r} (expected serve, patches, probe, "
                          "grace-period)")
    except ConfigError as e:
        print(f"entrypoint.py: {e}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
