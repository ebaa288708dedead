"""The supervisor's contract, against a fake `vllm serve` that prints the signals it receives."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.harness.editable import editable_venv
from vllm_intel.supervisor.timing import KILL_GRACE_S, TICK_S, deadline

from .conftest import ROOT, free_port

# Added to an upper bound (never to a lower one): a busy 2-core host can run a woken process late.
SLACK = 2.0


def received_at(out: str, sig: str) -> float:
    """Wall-clock time the fake vLLM got `sig` (it prints `got SIGTERM at T`)."""
    return float(re.search(rf"got {sig} at ([0-9.]+)", out).group(1))


@pytest.mark.parametrize(
    "sig",
    [
        signal.SIGHUP,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGQUIT,
        signal.SIGWINCH,
        signal.SIGRTMIN,
    ],
)
def test_other_signals_are_forwarded_to_vllm(run, tmp_path, sig):
    said = tmp_path / "fake.log"
    r = run({"FAKE_LOG": str(said)})
    r.wait_for(lambda: r.state() == "SERVING")
    r.signal(sig)
    name = signal.Signals(sig).name
    r.wait_for(lambda: said.exists() and f"got {name}" in said.read_text())
    r.signal(signal.SIGTERM)
    code, out, _ = r.finish()
    assert f"got {signal.Signals(sig).name}" in out
    assert code == 0


@pytest.mark.parametrize("stopped_s", [0.1, 1.0])
def test_a_stopped_and_continued_supervisor_carries_on(run, stopped_s):
    """SIGSTOP + SIGCONT of the supervisor (`kill -STOP`, a debugger attaching; a benchmark that
    paused idle servers found it): its wait for signals is interrupted, and when the stop outlasts
    the wait's time-out Python's signal.sigtimedwait returned a siginfo it never filled in, a
    random signal number, which killed the supervisor with EINVAL from os.kill."""
    r = run()
    r.wait_for(lambda: r.state() == "SERVING")
    for _ in range(3):
        r.signal(signal.SIGSTOP)
        time.sleep(stopped_s)
        r.signal(signal.SIGCONT)
        time.sleep(0.2)
    assert r.proc.poll() is None and r.state() == "SERVING"
    r.signal(signal.SIGTERM)
    code, out, _ = r.finish()
    assert code == 0 and "Traceback" not in out, out
    assert out.count("got SIGTERM") == 1 and "got SIGCONT" in out, out


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize(
    "on_term,expected", [("exit:0", 0), ("exit:3", 3), ("die:SIGSEGV", 128 + 11)]
)
def test_stop_signal_drains_once_and_returns_vllms_code(run, stop, on_term, expected):
    r = run({"FAKE_ON_TERM": on_term, "FAKE_DRAIN": "0.5"})
    r.wait_for(lambda: r.state() == "SERVING")
    r.signal(stop)
    code, out, took = r.finish()
    assert code == expected, out
    assert out.count("got SIGTERM") == 1  # SIGINT is turned into one SIGTERM for vLLM
    assert "state DRAINING" in out and "state KILLING" not in out


def test_shutdown_timeout_is_set_from_the_drain_setting(run):
    r = run({"INTEL_VLLM_DRAIN_TIMEOUT": "7"})
    r.wait_for(lambda: r.state() == "SERVING")
    r.signal(signal.SIGTERM)
    _, out, _ = r.finish()
    assert "--shutdown-timeout 7" in out


def test_users_shutdown_timeout_is_left_alone(run, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    r = run(args=["serve", str(model), "--port", str(free_port()), "--shutdown-timeout=12"])
    r.wait_for(lambda: r.state() == "SERVING")
    r.signal(signal.SIGTERM)
    _, out, _ = r.finish()
    assert "--shutdown-timeout=12" in out and "--shutdown-timeout 1" not in out
    assert "deadline 22 s" in out  # DRAIN from the user's flag + TEARDOWN


def test_xpu_drain_is_raised_to_five_seconds(run):
    r = run({"INTEL_VLLM_DEVICE": "xpu", "INTEL_VLLM_DRAIN_TIMEOUT": "0"})
    r.wait_for(lambda: r.state() == "SERVING")
    r.signal(signal.SIGTERM)
    _, out, _ = r.finish()
    assert "drain raised from 0 s to 5 s" in out and "--shutdown-timeout 5" in out


def test_second_signal_escalates_to_the_group(run):
    r = run({"FAKE_ON_TERM": "ignore"})
    r.wait_for(lambda: r.state() == "SERVING")
    r.signal(signal.SIGTERM)
    r.wait_for(lambda: r.state() == "DRAINING")
    time.sleep(0.3)
    r.signal(signal.SIGTERM)
    code, out, took = r.finish()
    assert code == 124, out
    assert out.count("got SIGTERM") == 2  # once from the drain, once from the group escalation
    assert "state KILLING" in out
    assert took < KILL_GRACE_S + SLACK  # KILL_GRACE, not the full deadline


def test_a_stop_while_starting_reaches_the_group_after_kill_grace(run):
    """Nothing is accepted while starting: if vLLM does not act on SIGTERM (its API server waits
    for the engine core), the group gets SIGTERM after KILL_GRACE, not after the drain."""
    r = run({"FAKE_ON_TERM": "ignore", "FAKE_READY_AFTER": "600", "INTEL_VLLM_DRAIN_TIMEOUT": "5"})
    r.wait_for(lambda: r.state() == "STARTING" and r.fake_answers())
    t0, sent = time.monotonic(), time.time()
    r.signal(signal.SIGTERM)
    code, out, _ = r.finish()
    took = time.monotonic() - t0
    # Forwarded at once, the group's at KILL_GRACE (3 s), the deadline's escalation at 12 s.
    times = [float(t) for t in re.findall(r"got SIGTERM at ([\d.]+)", out)]
    assert len(times) == 3 and "SIGTERM to its process group" in out, out
    assert KILL_GRACE_S <= times[1] - sent <= KILL_GRACE_S + TICK_S + SLACK, (sent, times)
    # The fake ignores them all: the deadline (5 + 10 s) still ends it, as for any stop.
    assert code == 124 and deadline(5) <= took <= deadline(5) + SLACK, (took, out)


def test_a_stop_just_after_vllm_became_ready_drains_instead_of_killing_the_group(run):
    """vLLM ready between two /health polls: the supervisor still says STARTING when SIGTERM comes,
    but vLLM answers HTTP and may hold accepted requests (seen in a benchmark: a stream cut when
    the group's SIGTERM hit an engine draining it). Here /health never says ready, /metrics
    answers: one SIGTERM only, the fake's 5 s drain runs out, exit 0."""
    r = run(
        {
            "FAKE_READY_AFTER": "600",
            "FAKE_METRICS_AFTER": "0",
            "FAKE_DRAIN": "5",
            "INTEL_VLLM_DRAIN_TIMEOUT": "30",
        }
    )
    r.wait_for(lambda: r.state() == "STARTING" and r.fake_answers("/metrics"))
    t0 = time.monotonic()
    r.signal(signal.SIGTERM)
    code, out, _ = r.finish()
    assert code == 0 and out.count("got SIGTERM") == 1, out
    assert "vLLM was serving when the stop came" in out and "process group" not in out, out
    assert 4.5 <= time.monotonic() - t0 <= 9, out


def test_deadline_kills_the_group(run):
    r = run({"FAKE_ON_TERM": "ignore", "INTEL_VLLM_DRAIN_TIMEOUT": "0"})
    r.wait_for(lambda: r.state() == "SERVING")
    t0 = time.monotonic()
    r.signal(signal.SIGTERM)
    code, out, _ = r.finish()
    took = time.monotonic() - t0
    assert code == 124, out
    assert deadline(0) <= took <= deadline(0) + SLACK, took  # DRAIN 0 + TEARDOWN 10
    assert "deadline" in out


def test_orphans_in_the_group_are_killed_and_reaped(run, tmp_path):
    pid_file = tmp_path / "orphan.pid"
    r = run({"FAKE_ORPHAN": str(pid_file)})
    r.wait_for(lambda: pid_file.exists() and pid_file.read_text())
    orphan = int(pid_file.read_text())
    r.signal(signal.SIGTERM)
    code, out, _ = r.finish()
    assert code == 0
    assert "killing the group" in out
    with pytest.raises(ProcessLookupError):
        os.kill(orphan, 0)


@pytest.mark.parametrize("exit_code,expected", [("0", 70), ("5", 70), ("1", 70)])
def test_unrequested_exit_is_reported(run, exit_code, expected):
    r = run({"FAKE_EXIT_AFTER": f"1,{exit_code}"})
    code, out, _ = r.finish()
    assert code == expected, out
    assert "without a stop request" in out


def test_probes_follow_the_state(run):
    # The drain outlasts two probe processes on a loaded host: SIGTERM reaches vLLM before the
    # state file says DRAINING, so vLLM's drain clock runs from before the checks below.
    r = run({"FAKE_READY_AFTER": "1.5", "FAKE_DRAIN": "5"})
    r.wait_for(lambda: r.state() == "STARTING")
    assert r.probe("ready") == 1  # not ready before /health answers
    assert r.probe("live") == 0  # loading is alive
    r.wait_for(lambda: r.state() == "SERVING")
    assert r.probe("ready") == 0 and r.probe("live") == 0
    r.signal(signal.SIGTERM)
    r.wait_for(lambda: r.state() == "DRAINING")
    assert r.probe("ready") == 1  # out of rotation from the moment draining starts
    assert r.probe("live") == 0
    assert r.finish()[0] == 0
    assert r.probe("ready") == 1 and r.probe("live") == 1


def test_nothing_is_left_behind_and_stale_leftovers_are_removed(run, tmp_path):
    from vllm_intel.supervisor import janitor

    shm = tmp_path / "shm"
    shm.mkdir(exist_ok=True)
    (shm / "psm_deadbeef").write_bytes(b"x")  # a crashed run's segment, in its claim
    (shm / "psm_0abc").write_bytes(b"x")  # a segment no run claims (another server's?)
    (shm / "unrelated").write_bytes(b"x")  # not vLLM's: never touched
    stale_run = tmp_path / "vllm-intel-run-old"
    stale_run.mkdir()
    # The crashed run: its claim and its run directory's lock exist, nobody holds them.
    os.close(janitor.create_locked(stale_run / janitor.LOCK_FILE))
    crashed = janitor.Claim(shm, stale_run)
    crashed.add({"psm_deadbeef"})
    os.close(crashed.fd)
    r = run({"FAKE_SHM": "psm_c0ffee"})  # created and mapped by "this server" during the run
    r.wait_for(lambda: r.state() == "SERVING")
    run_dirs = list(tmp_path.glob("vllm-intel-run-*"))
    assert len(run_dirs) == 1 and run_dirs[0].name != "vllm-intel-run-old"
    r.wait_for(lambda: "psm_c0ffee" in (shm / next(shm.glob("*.claim")).name).read_text())
    r.signal(signal.SIGTERM)
    code, out, _ = r.finish()
    assert code == 0
    assert "stale leftover" in out and str(shm / "psm_deadbeef") in out
    assert "left alone 1" in out and str(shm / "psm_0abc") in out
    assert sorted(p.name for p in shm.iterdir()) == ["psm_0abc", "unrelated"]
    assert not list(tmp_path.glob("vllm-intel-run-*"))
    assert not (tmp_path / "state.json").exists()


@pytest.mark.parametrize(
    "env,args,message",
    [
        (
            {"INTEL_VLLM_DRAIN_TIMEOUT": "abc"},
            None,
            "INTEL_VLLM_DRAIN_TIMEOUT must be a whole number",
        ),
        (
            {"INTEL_VLLM_DRAIN_TIMEOUT": "-1"},
            None,
            "INTEL_VLLM_DRAIN_TIMEOUT must be a whole number",
        ),
        (
            {"INTEL_VLLM_DRAIN_TIMEOUT": "1.5"},
            None,
            "INTEL_VLLM_DRAIN_TIMEOUT must be a whole number",
        ),
        ({"INTEL_VLLM_DEVICE": "gpu"}, None, "INTEL_VLLM_DEVICE must be cpu or xpu"),
        ({}, ["serve", "/no/such/model"], "model path /no/such/model does not exist"),
        ({}, ["serve", "./missing", "--port", "1"], "model path ./missing does not exist"),
        ({}, ["serve", "/tmp", "--shutdown-timeout", "soon"], "--shutdown-timeout must be a whole"),
        ({}, ["serve", "/tmp", "--port"], "--port needs a value"),
        ({}, ["frobnicate"], "unknown subcommand 'frobnicate'"),
        ({}, ["probe", "maybe"], "probe takes `ready` or `live`"),
    ],
)
def test_bad_input_is_one_line_and_exit_64(run, env, args, message):
    r = run(env, args)
    code, out, took = r.finish()
    assert code == 64
    lines = out.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out
    assert "fake vllm" not in out  # nothing started
    assert took < 5


@pytest.mark.parametrize("host", [None, "127.0.0.1"])
def test_port_in_use_is_one_line_and_exit_64(run, tmp_path, host):
    """Another server on vLLM's port: said before vLLM starts. Without the check vLLM failed to
    bind only after loading the model, and the supervisor first reported SERVING from the other
    server's /health."""
    import socket

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        model = tmp_path / "m"
        model.mkdir()
        args = ["serve", str(model), "--port", str(port)] + (["--host", host] if host else [])
        code, out, took = run({}, args).finish()
    assert code == 64, out
    lines = out.strip().splitlines()
    where = f"{host}:{port}" if host else f"port {port}"
    assert len(lines) == 1 and f"cannot listen on {where}: Address already in use" in lines[0], out
    assert "fake vllm" not in out and took < 5


def test_vllm_not_installed_is_127(tmp_path):
    import subprocess

    bare = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    model = tmp_path / "m"
    model.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # That python with its own packages and this checkout, installed as a checkout is (editable).
    python = editable_venv(ROOT, tmp_path / "venv", bare, system_site=True)
    res = subprocess.run(
        [python, "-I", str(ROOT / "entrypoint.py"), "serve", str(model)],
        capture_output=True,
        text=True,
        env=env,
    )
    if "vLLM is not installed" not in res.stderr:
        pytest.fail(f"{bare} unexpectedly has vLLM; output: {res.stderr}")
    assert res.returncode == 127
    assert len(res.stderr.strip().splitlines()) == 1


def test_grace_period_follows_the_formula(tmp_path):
    import subprocess

    def grace(*args, **env):
        return subprocess.run(
            [sys.executable, str(ROOT / "entrypoint.py"), "grace-period", *args],
            capture_output=True,
            text=True,
            env=dict(os.environ, **env),
        ).stdout.strip()

    assert grace(INTEL_VLLM_DRAIN_TIMEOUT="30") == "45"
    assert grace(INTEL_VLLM_DRAIN_TIMEOUT="120") == "135"
    assert grace(INTEL_VLLM_DRAIN_TIMEOUT="0", INTEL_VLLM_DEVICE="xpu") == "20"
    # serve's own --shutdown-timeout, on the command line or in its --config file, beats the env
    conf = tmp_path / "serve.yaml"
    conf.write_text("shutdown-timeout: 200\n")
    assert grace("--shutdown-timeout=100", INTEL_VLLM_DRAIN_TIMEOUT="30") == "115"
    assert grace("m", "--config", str(conf), INTEL_VLLM_DRAIN_TIMEOUT="30") == "215"
    assert grace("--config", str(conf), "--shutdown-timeout", "60") == "75"


def test_orphans_that_exit_are_reaped(run, tmp_path):
    pid_file = tmp_path / "orphan.pid"
    r = run({"FAKE_ZOMBIE": str(pid_file)})
    r.wait_for(lambda: pid_file.exists() and pid_file.read_text())
    orphan = int(pid_file.read_text())
    time.sleep(0.3)
    assert psutil.Process(orphan).ppid() == r.proc.pid  # re-parented to us
    r.wait_for(lambda: not psutil.pid_exists(orphan))  # exited and reaped: not left a zombie
    r.signal(signal.SIGTERM)
    assert r.finish()[0] == 0


def test_live_shared_memory_of_other_processes_is_never_removed(run, tmp_path):
    """Segments and semaphores that some process still uses stay, whatever their age; glibc maps
    a semaphore under a temporary name, so this needs the inode check."""
    import subprocess

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            """
import multiprocessing as mp, multiprocessing.shared_memory as sm, sys, time
lock = mp.get_context("spawn").Lock()     # a named semaphore /dev/shm/sem.mp-*
seg = sm.SharedMemory(create=True, size=4096)  # /dev/shm/psm_*
print(lock._semlock.name, seg.name, flush=True)
time.sleep(60)
""",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        sem, seg = holder.stdout.readline().split()
        sem_path = pathlib.Path("/dev/shm/sem." + sem.lstrip("/"))
        seg_path = pathlib.Path("/dev/shm/" + seg.lstrip("/"))
        assert sem_path.exists() and seg_path.exists()
        r = run({"INTEL_VLLM_SHM_DIR": "/dev/shm"})
        r.wait_for(lambda: r.state() == "SERVING")
        r.signal(signal.SIGTERM)
        assert r.finish()[0] == 0
        assert sem_path.exists() and seg_path.exists()
    finally:
        holder.kill()
        holder.wait()


def test_vllm_does_not_outlive_a_killed_supervisor(run):
    import json

    r = run()
    r.wait_for(lambda: r.state() == "SERVING")
    child = json.loads((r.tmp / "state.json").read_text())["child"]
    r.signal(signal.SIGKILL)
    r.proc.wait()
    end = time.monotonic() + 5
    while psutil.pid_exists(child) and time.monotonic() < end:
        time.sleep(0.05)
    assert not psutil.pid_exists(child)


def test_sigterm_is_forwarded_at_once_even_when_metrics_hangs(run):
    """Nothing on the signal path waits for vLLM's HTTP server: /metrics never answers here."""
    code, out, t0 = run({"FAKE_METRICS": "hang", "FAKE_DRAIN": "0.5"}).stop_when_serving()
    assert code == 0, out
    latency = received_at(out, "SIGTERM") - t0
    assert latency < 0.5, f"SIGTERM reached vLLM {latency:.3f} s after the supervisor got it"
    assert "in flight at SIGTERM" not in out  # never counted, and never waited for


def test_requests_in_flight_are_counted_from_metrics(run):
    code, out, _ = run({"FAKE_RUNNING": "2", "FAKE_DRAIN": "1"}).stop_when_serving()
    assert code == 0
    assert "; 2 in flight at SIGTERM, 0 finished, 0 aborted, 2 still running" in out, out


def test_http_probes_follow_the_state(run):
    import urllib.error
    import urllib.request

    probe_port = free_port()

    def status(kind: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{probe_port}/{kind}", timeout=5) as res:
                return res.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return 0

    r = run(
        {"FAKE_READY_AFTER": "1.5", "FAKE_DRAIN": "5", "INTEL_VLLM_PROBE_PORT": str(probe_port)}
    )
    r.wait_for(lambda: r.state() == "STARTING" and status("live") != 0)
    assert status("ready") == 503 and status("live") == 200
    r.wait_for(lambda: r.state() == "SERVING")
    assert status("ready") == 200 and status("live") == 200

    def cli(kind: str) -> int:  # `probe KIND` with no --port: answered by the probe port
        return subprocess.run(
            [sys.executable, str(ROOT / "entrypoint.py"), "probe", kind],
            env=dict(r.env, INTEL_VLLM_STATE_FILE="/nonexistent"),
            capture_output=True,
        ).returncode

    assert cli("ready") == 0 and cli("live") == 0
    r.signal(signal.SIGTERM)
    r.wait_for(lambda: r.state() == "DRAINING")
    assert status("ready") == 503 and status("live") == 200
    assert cli("ready") == 1 and cli("live") == 0
    assert status("nothing") == 404
    assert r.finish()[0] == 0
    assert status("ready") == 0  # gone with the supervisor
