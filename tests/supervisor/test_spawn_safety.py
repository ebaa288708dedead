"""Supervisor.spawn runs after the probe and observer threads exist: no preexec_fn (Python code
between fork and exec, unsafe with threads), yet vLLM starts set up as a preexec_fn would have
it: every signal unblocked, default dispositions, PDEATHSIG, a session of its own; a command that
cannot be executed is still CANNOT_EXEC."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.harness import ROOT, free_port
from vllm_intel.supervisor import loop
from vllm_intel.supervisor.errors import Exit

# What the child reports: its mask, ignored signals, PDEATHSIG, session, process.
REPORT = textwrap.dedent(
    """\
    import ctypes, json, os, sys
    status = dict(l.split(":\\t", 1) for l in open("/proc/self/status").read().splitlines())
    sig = ctypes.c_int()
    ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
    print(json.dumps({
        "blocked": int(status["SigBlk"], 16),
        "ignored": int(status["SigIgn"], 16),
        "pdeathsig": sig.value,
        "session_leader": os.getsid(0) == os.getpid(),
        "pid": os.getpid(),
        "exe": os.path.basename(sys.executable),
    }), flush=True)
    """
)

# The supervisor's situation, in a process of its own: signals blocked, threads running; then
# Supervisor.spawn, with Popen recorded.
SPAWN = textwrap.dedent(
    """\
    import json, os, pathlib, signal, subprocess, sys, threading, time
    from vllm_intel.supervisor import loop, settings

    for sig in json.loads(sys.argv[5]):  # as inherited from nohup or a background job
        signal.signal(sig, signal.SIG_IGN)
    calls = []
    real = subprocess.Popen
    def recording(*args, **kwargs):
        calls.append(sorted(k for k, v in kwargs.items() if v is not None))
        return real(*args, **kwargs)
    subprocess.Popen = recording

    loop.Supervisor.block_signals()
    stop = threading.Event()
    for _ in range(3):  # like the probe server's and the observer's
        threading.Thread(target=stop.wait, daemon=True).start()
    loop._EXEC_CHILD = json.loads(sys.argv[1]) or loop._EXEC_CHILD  # a broken one, in a test
    argv = json.loads(sys.argv[2])
    cfg = settings.ServeConfig(argv=argv, port=int(sys.argv[3]), drain=1, notes=[])
    sup = loop.Supervisor(cfg, pathlib.Path(sys.argv[4]))
    failed = sup.spawn(dict(os.environ))
    sup.observer.stop()
    if failed is None:
        pid, status = os.waitpid(sup.child.pid, 0)
        sup.child.returncode = 0
        print("child", sup.child.pid, os.waitstatus_to_exitcode(status), flush=True)
    print("failed", failed, flush=True)
    print("popen", json.dumps(calls), flush=True)
    """
)


# _EXEC_CHILD with a set-up step that fails
BROKEN_SET_UP = loop._EXEC_CHILD.replace("try:\n", "try:\n    raise OSError('broken')\n", 1)


def spawn(
    tmp_path: pathlib.Path,
    argv: list[str],
    exec_child: str | None = None,
    ignored: tuple[int, ...] = (),
):
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            SPAWN,
            json.dumps(exec_child),
            json.dumps(argv),
            str(free_port()),
            str(tmp_path / "state.json"),
            json.dumps([int(s) for s in ignored]),
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run
    return run


def report(run) -> dict:
    return json.loads(next(line for line in run.stdout.splitlines() if line.startswith("{")))


def test_spawn_uses_no_preexec_fn(tmp_path):
    run = spawn(tmp_path, [sys.executable, "-c", "pass"])
    popen = json.loads(run.stdout.split("popen ", 1)[1])
    assert len(popen) == 1 and "preexec_fn" not in popen[0], popen
    assert "start_new_session" in popen[0]
    assert "failed None" in run.stdout


def test_vllm_starts_set_up(tmp_path):
    """Signals unblocked (the supervisor blocks them in every thread, and a mask survives fork
    and exec), SIGPIPE/SIGXFSZ/SIGINT not ignored, PDEATHSIG SIGKILL, its own session; and the
    pid Popen returned is vLLM's own (the wrapper execs, it does not fork)."""
    run = spawn(tmp_path, [sys.executable, "-c", REPORT])
    got = report(run)
    assert got["blocked"] == 0, run.stdout
    assert got["pdeathsig"] == signal.SIGKILL
    assert got["session_leader"]
    assert f"child {got['pid']} 0" in run.stdout


@pytest.mark.parametrize(
    "inherited",
    [(), (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1)],
    ids=["clean", "nohup-background"],
)
def test_vllm_inherits_no_ignored_or_blocked_signal(tmp_path, inherited):
    """Read by a program that is not Python (a Python child ignores SIGPIPE and SIGXFSZ itself):
    what the wrapper interpreter set at its start-up is undone before the exec, and so is what
    the supervisor itself inherited ignored (`nohup ... &` from a script ignores SIGHUP, SIGINT
    and SIGQUIT): a signal the supervisor forwards must reach vLLM."""
    run = spawn(tmp_path, ["cat", "/proc/self/status"], ignored=inherited)
    status = dict(line.split(":\t", 1) for line in run.stdout.splitlines() if ":\t" in line)
    assert int(status["SigBlk"], 16) == 0, status["SigBlk"]
    ignored = int(status["SigIgn"], 16)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, *loop.STOPPING, signal.SIGHUP, *inherited):
        assert not ignored & (1 << (sig - 1)), (sig, hex(ignored))


def test_what_cannot_be_executed_is_cannot_exec(tmp_path, capfd):
    run = spawn(tmp_path, ["/nonexistent/vllm", "serve"])
    assert f"failed {Exit.CANNOT_EXEC}" in run.stdout, run
    assert (
        "cannot execute /nonexistent/vllm: [Errno 2] No such file or directory: "
        "'/nonexistent/vllm'" in run.stderr
    ), run.stderr
    assert "Traceback" not in run.stderr


def test_a_failed_set_up_is_cannot_exec(tmp_path):
    run = spawn(tmp_path, [sys.executable, "-c", "pass"], exec_child=BROKEN_SET_UP)
    assert "cannot execute" in run.stderr and "set-up failed" in run.stderr, run.stderr
    assert "child " not in run.stdout


def test_popen_exec_errors(monkeypatch):
    with pytest.raises(FileNotFoundError):
        loop.popen_exec(["/nonexistent/vllm"], dict(os.environ))
    with monkeypatch.context() as m:
        m.setattr(loop, "_EXEC_CHILD", BROKEN_SET_UP)
        with pytest.raises(subprocess.SubprocessError):
            loop.popen_exec([sys.executable, "-c", "pass"], dict(os.environ))
    child = loop.popen_exec([sys.executable, "-c", "import sys; sys.exit(3)"], dict(os.environ))
    assert child.wait(30) == 3


def test_a_signal_sent_while_the_child_sets_up_is_not_lost():
    """The supervisor forwards to the child's pid from the moment Popen returns; a signal that
    reaches it while it still sets up (blocked: pending) acts once unblocked, as on a vLLM that
    has no handlers yet: SIGTERM ends it."""
    script = textwrap.dedent(
        """\
        import os, signal, subprocess, sys
        from vllm_intel.supervisor import loop
        loop.Supervisor.block_signals()
        real = subprocess.Popen
        def popen(*args, **kwargs):
            child = real(*args, **kwargs)
            os.kill(child.pid, signal.SIGTERM)  # before it has exec'd, most likely
            return child
        subprocess.Popen = popen
        child = loop.popen_exec([sys.executable, "-c", "import time; time.sleep(30)"],
                                dict(os.environ))
        print(child.wait(30), flush=True)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.stdout.strip() == str(-signal.SIGTERM), run


def test_vllm_follows_a_sigkilled_supervisor():
    """PR_SET_PDEATHSIG survives the wrapper's exec: kill -9 of the supervisor kills vLLM."""
    script = textwrap.dedent(
        """\
        import os, sys, time
        from vllm_intel.supervisor import loop
        loop.Supervisor.block_signals()
        child = loop.popen_exec([sys.executable, "-c", "import time; time.sleep(60)"],
                                dict(os.environ))
        print(child.pid, flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pid = int(proc.stdout.readline())
        proc.kill()
        proc.wait(10)
        end = time.monotonic() + 10
        while time.monotonic() < end and alive(pid):
            time.sleep(0.05)
        assert not alive(pid)
    finally:
        proc.kill()
        proc.wait()


def alive(pid: int) -> bool:
    """Running, not a zombie awaiting a reaper."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
