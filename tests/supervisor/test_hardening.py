"""Inputs that once ended in a traceback or touched what is not the run's: numbers and JSON read
through one bounded parser, the user's files and mounts, secrets on the command line, tensor
parallel on one NUMA node, the exit code of an unrequested exit, vLLM's CPU communicator segments.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from vllm_intel.supervisor import errors, janitor, paths, plan, probe_client, probes, vllm_args
from vllm_intel.supervisor.limits import Limits
from vllm_intel.supervisor.workload import Workload

from .conftest import FAKE, ROOT
from .test_probe_server import get

PY = sys.executable


def entrypoint(args, tmp_path, env=None, timeout=10):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    full = {
        k: v for k, v in os.environ.items() if not k.startswith(("INTEL_VLLM_", "VLLM_", "OMP_"))
    }
    full.update(
        PYTHONPATH=str(FAKE),
        TMPDIR=str(tmp_path),
        INTEL_VLLM_SHM_DIR=str(tmp_path),
        INTEL_VLLM_STATE_FILE=str(tmp_path / "state.json"),
    )
    full.update(env or {})
    args = [a.replace("{model}", str(model)) for a in args]
    return subprocess.run(
        [PY, str(ROOT / "entrypoint.py"), *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line_64(r):
    lines = [line for line in r.stderr.splitlines() if line]
    assert "Traceback" not in r.stderr, r.stderr[-1500:]
    assert r.returncode == 64, (r.returncode, r.stderr[-1500:])
    assert len(lines) == 1 and lines[0].startswith("entrypoint.py: "), lines
    return lines[0]


# ------------------------------------------------------------------ 1. numbers and JSON


@pytest.mark.parametrize("var", ["VLLM_CPU_KVCACHE_SPACE", "VLLM_MQ_MAX_CHUNK_BYTES_MB"])
@pytest.mark.parametrize("value", ["9" * 5000, "١٢"])
def test_numbers_from_the_environment_are_one_line(tmp_path, var, value):
    line = one_line_64(entrypoint(["plan", "{model}"], tmp_path, {var: value}))
    assert var in line


def test_one_parser_takes_ascii_digits_only():
    assert errors.parse_whole("X", " 12 ") == 12
    assert errors.parse_whole("X", "-3", signed=True) == -3
    for bad in ["١٢", "²", "9" * 5000, "1_000", "0x10", "", "-3", None]:
        with pytest.raises(errors.ConfigError, match="^X must be"):
            errors.parse_whole("X", bad)


def test_a_flag_with_unicode_digits_is_refused():
    with pytest.raises(errors.ConfigError, match="--port must be a whole number"):
        vllm_args.resolve(["m", "--port", "٨٠٠٠"])


def test_a_deeply_nested_config_json_is_one_line(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("[" * 100_000)
    line = one_line_64(entrypoint(["plan", str(model)], tmp_path))
    assert "nested" in line


@pytest.mark.parametrize(
    "url", ["http://[::1%\u0000]:8000", "http://127.0.0.1:8000/\u0001", "http://127.0.0.1:1/a b"]
)
def test_a_planted_state_file_with_a_control_character_is_refused(tmp_path, url):
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"state": "SERVING", "pid": os.getpid(), "url": url}))
    r = subprocess.run(
        [PY, str(ROOT / "entrypoint.py"), "probe", "ready", "--port", "1"],
        env={**os.environ, "INTEL_VLLM_STATE_FILE": str(state)},
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert "Traceback" not in r.stderr, r.stderr[-1500:]
    assert r.returncode == 1 and "is not a URL" in r.stderr


def test_a_deeply_nested_state_file_or_claim_is_refused(tmp_path):
    with pytest.raises(ValueError, match="nested"):
        probe_client.parse_state(b"[" * 100_000)
    fd = os.open(tmp_path / "claim", os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, b"{" * 100_000)
    assert janitor.read_claim(fd) == {}
    os.close(fd)


def test_sigint_in_a_subcommand_is_one_line(tmp_path):
    """Not `serve` (its signals are held from entrypoint.py's first line): a subcommand stopped
    by Ctrl-C while it works (here `probe`, waiting on a /health that never answers) ends in
    one line, exit 130, never a KeyboardInterrupt traceback."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        state = tmp_path / "state.json"
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        state.write_text(json.dumps({"state": "SERVING", "pid": os.getpid(), "url": url}))
        proc = subprocess.Popen(
            [PY, str(ROOT / "entrypoint.py"), "probe", "ready", "--port", "1"],
            env={**os.environ, "INTEL_VLLM_STATE_FILE": str(state)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        end = time.monotonic() + 30
        while time.monotonic() < end and not _connected(silent):
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    assert "Traceback" not in err, err[-1500:]
    assert proc.returncode == 130 and err.strip().count("\n") == 0, (proc.returncode, err)


@pytest.mark.parametrize("after", [0.0, 0.01, 0.03, 0.08])
def test_sigint_in_the_first_milliseconds_of_a_subcommand_is_one_line(after):
    """Ctrl-C while the interpreter still imports (entrypoint.py holds SIGINT from its first line
    until its handler is in place): one line and exit 130; before its first line, whatever the
    interpreter's start does with it, never a traceback through our code."""
    proc = subprocess.Popen(
        [PY, str(ROOT / "entrypoint.py"), "plan", "/nonexistent-model"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(after)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    # No traceback through our code, whenever the signal came: before entrypoint.py's first line
    # the interpreter's start deals with it (exit 1 or the signal's default, -2); from then on our
    # handler (one line, 130); or the plan refused the model first (64) and Python's exit met it.
    # ("entrypoint.py", line 0: the interpreter checked its signals before the first line ran).
    # Our code is the checkout's files; setuptools' editable finder (site-packages'
    # __editable___vllm_intel_*_finder.py, run by site before our first line) is the interpreter's start.
    roots = "|".join(re.escape(str(r)) for r in {ROOT, ROOT.resolve()})
    ours = rf'({roots})/(entrypoint\.py", line [1-9]|vllm_intel/|patches/)'
    assert not re.search(r'File "' + ours, err), err[-1500:]
    assert proc.returncode in (130, 64, 1, -signal.SIGINT), (proc.returncode, err)
    if "interrupted (SIGINT)" in err:
        assert proc.returncode == 130, (proc.returncode, err)


def _connected(listening: socket.socket) -> bool:
    """A client waits in `listening`'s backlog (accepted here and kept open, unanswered)."""
    listening.setblocking(False)
    try:
        conn, _ = listening.accept()
    except BlockingIOError:
        return False
    _KEEP.append(conn)
    return True


_KEEP: list[socket.socket] = []


# ------------------------------------------------------------------ 2. the user's files and mounts


def test_an_existing_file_of_the_user_is_not_taken_as_the_state_file(tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes")
    with pytest.raises(errors.ConfigError, match="existing file"):
        paths.check_state_file(mine)
    assert mine.read_text() == "my notes"


def test_a_stale_state_file_of_a_dead_supervisor_may_be_replaced(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / "state.json"
    fd = os.open(stale, os.O_WRONLY | os.O_CREAT, 0o600)
    data = {"state": "SERVING", "pid": dead.pid, "port": 1, "url": "", "child": None, "drain": 1}
    os.write(fd, json.dumps(data).encode())
    os.close(fd)
    assert paths.check_state_file(stale) == stale


def test_serve_refuses_to_overwrite_the_users_file(tmp_path):
    mine = tmp_path / "mine.json"
    mine.write_text("precious")
    r = entrypoint(
        ["serve", "{model}", "--port", "18999"], tmp_path, {"INTEL_VLLM_STATE_FILE": str(mine)}
    )
    one_line_64(r)
    assert mine.read_text() == "precious"


def test_the_removal_never_crosses_a_mount_point(tmp_path):
    run = tmp_path / f"{paths.RUN_DIR_PREFIX}x"
    (run / "sub" / "mnt").mkdir(parents=True)
    (run / "f").write_text("x")
    (run / "sub" / "mnt" / "precious").write_text("the user's")
    mounts = {os.path.realpath(run / "sub" / "mnt")}
    assert janitor.remove_tree(run, mounts) is False
    assert (run / "sub" / "mnt" / "precious").read_text() == "the user's"
    assert not (run / "f").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a bind mount needs root")
def test_the_sweep_leaves_a_bind_mount_in_a_dead_run_dir(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "precious").write_text("the user's")
    run = tmp_path / f"{paths.RUN_DIR_PREFIX}dead"
    (run / "mnt").mkdir(parents=True)
    janitor.create_locked(run / janitor.LOCK_FILE)  # its fd leaks: closed below, the run dies
    if subprocess.run(["mount", "--bind", str(user), str(run / "mnt")]).returncode != 0:
        pytest.skip("cannot bind mount here")
    try:
        for fd in os.listdir("/proc/self/fd"):  # the dead run's lock: close every fd of the file
            try:
                if os.readlink(f"/proc/self/fd/{fd}") == str(run / janitor.LOCK_FILE):
                    os.close(int(fd))
            except OSError:
                pass
        janitor.sweep(tmp_path / "noshm", tmp_path, in_use=set)
        assert (user / "precious").read_text() == "the user's"
    finally:
        subprocess.run(["umount", str(run / "mnt")])


def test_probe_ignores_a_planted_private_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = paths.private_dir()
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)
    (planted / "vllm-intel-8000.state.json").write_text(
        json.dumps({"state": "SERVING", "pid": os.getpid(), "url": "http://127.0.0.1:1"})
    )
    monkeypatch.setattr(probe_client, "healthy", lambda url, timeout: True)
    assert probe_client.probe(["ready", "--port", "8000"], env={}) == 1
    assert "private directory" in capsys.readouterr().err


def test_the_probe_port_does_not_spin_when_out_of_fds(capfd, monkeypatch):
    """At EMFILE the connection stays in the backlog and the listening socket stays readable:
    the accept loop must back off (the port's thread nearly idle), not call accept() as fast as
    a core can, and say so once; once an fd is free the waiting probe is answered."""
    import resource

    monkeypatch.setattr(probes, "_logged", set())
    server = probes.ProbeServer(0, lambda kind: (True, "ok")).start()
    port = server.server_address[1]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    try:
        assert get(port, "/live")[0] == 200  # the loop runs
        client = socket.socket(socket.AF_INET)
        # opened before the fds run out: read again (pread) while none is left
        stat_fd = os.open(f"/proc/self/task/{server._thread.native_id}/stat", os.O_RDONLY)
        held.append(stat_fd)
        top = max(int(fd) for fd in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (top + 8, hard))
        try:
            while True:
                held.append(os.dup(0))
        except OSError:
            pass
        client.connect(("127.0.0.1", port))  # waits in the backlog
        client.sendall(b"GET /live HTTP/1.0\r\n\r\n")
        time.sleep(0.1)
        before = thread_cpu(stat_fd)
        time.sleep(1.0)
        busy = thread_cpu(stat_fd) - before
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        client.settimeout(5)
        answer = client.recv(100)  # accepted once asyncio tries again
    finally:
        client.close()
        server.shutdown()
        server.server_close()
    assert busy < 0.2, f"the probe port's thread took {busy:.2f} s of CPU in 1 s at EMFILE: a spin"
    assert answer.startswith(b"HTTP/1.0 200"), answer
    err = capfd.readouterr().err
    assert err.count("probe port: socket.accept() out of system resource") == 1, err
    assert "Traceback" not in err, err


def thread_cpu(stat_fd: int) -> float:
    """User + system CPU seconds of the thread whose /proc/self/task/TID/stat is `stat_fd`."""
    fields = os.pread(stat_fd, 4096, 0).rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


@pytest.mark.parametrize(
    "flag", [["--api-key", "s3cret"], ["--api-key=s3cret"], ["--api_key", "s3cret"]]
)
def test_api_key_on_the_command_line_is_refused_like_hf_token(tmp_path, flag):
    line = one_line_64(entrypoint(["plan", "{model}", *flag], tmp_path))
    assert "VLLM_API_KEY" in line and "s3cret" not in line


def test_secret_flags_are_one_list():
    for flag, env in vllm_args.SECRET_FLAGS.items():
        with pytest.raises(errors.ConfigError, match=env):
            vllm_args.resolve(["m", flag, "x"])
    vllm_args.resolve(["m", "--api-server-count", "1"])  # not a secret's abbreviation


# ------------------------------------------------------------------ 3. tensor parallel on CPU


def limits(cpus, nodes=None, quota=None):
    return Limits("v2", tuple(cpus), quota, None, len(cpus), nodes or {0: tuple(cpus)})


def test_tp_on_one_numa_node_binds_each_rank():
    p = plan.plan(limits([0, 1]), Workload(2, 1, 0, None), {})
    assert p.env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1", p.line()
    p = plan.plan(limits(range(8)), Workload(2, 1, 0, None), {})
    assert p.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-3|4-7", p.line()
    # one NUMA node per rank: vLLM's own auto binding works, left to it
    two = limits(range(4), {0: (0, 1), 1: (2, 3)})
    assert "VLLM_CPU_OMP_THREADS_BIND" not in plan.plan(two, Workload(2, 1, 0, None), {}).env


def test_tp_with_fewer_cpus_than_ranks_is_refused():
    with pytest.raises(errors.ConfigError, match="need 3 CPUs"):
        plan.plan(limits([0, 1]), Workload(3, 1, 0, None), {})


def test_plan_shows_the_rank_binding(tmp_path):
    r = entrypoint(["plan", "{model}", "--tensor-parallel-size", "2"], tmp_path)
    assert "Traceback" not in r.stderr
    if len(os.sched_getaffinity(0)) >= 2 and r.returncode == 0 and "1 NUMA" in r.stdout:
        assert "VLLM_CPU_OMP_THREADS_BIND=" in r.stdout and "|" in r.stdout, r.stdout


def test_an_engine_that_dies_at_start_is_exit_70(tmp_path):
    r = entrypoint(
        ["serve", "{model}", "--port", str(_free_port())],
        tmp_path,
        {"FAKE_EXIT_AFTER": "0.2,1", "INTEL_VLLM_DRAIN_TIMEOUT": "1"},
    )
    assert r.returncode == 70, (r.returncode, r.stderr[-1500:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_cpu_communicator_segments_are_the_runs(tmp_path):
    name = "vllm_dist_0123456789abcdef0123456789abcdef-tp:0-[0-1]-cpushm_0"
    assert janitor.is_vllm_shm(name)
    assert janitor.is_vllm_shm(name.replace("_0", "_1", 1).replace("cpushm_0", "cpushm_1"))
    # what Intel OpenMP leaves of a killed process (GNU OpenMP leaves nothing there)
    assert janitor.is_vllm_shm("__KMP_REGISTERED_LIB_4242_0")
    assert not janitor.is_vllm_shm("__KMP_REGISTERED_LIB_4242_0.tmp")
    shm = tmp_path / "shm"
    shm.mkdir()
    ours, theirs = shm / name, shm / name.replace("0123", "ffff")
    ours.write_bytes(b"\0" * 64)
    theirs.write_bytes(b"\0" * 64)
    claim = janitor.Claim(shm, tmp_path)
    with open(ours, "rb") as f:
        import mmap

        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        watcher = janitor.Watcher(claim, shm, os.getpid())
        watcher.scan()
        m.close()
    assert name in claim.names and theirs.name not in claim.names
    claim.release()
    assert not ours.exists() and theirs.exists()  # a second server's segment is never removed
