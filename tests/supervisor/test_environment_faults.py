"""Environment faults: what a container's environment can do to the supervisor, against the fake
`vllm serve`. An HTTP proxy in the environment (Docker injects `http_proxy`), a SIGTERM while PID 1
is still starting, a log reader that went away or stopped reading, a metrics linger after a forced
drain: each must end as the exit-code table says, in time."""

from __future__ import annotations

import http.server
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from vllm_intel.supervisor import timing

from .conftest import FAKE, ROOT, fake_answers, fake_env, free_port, serving

# -- an HTTP proxy in the environment -------------------------------------------------------------


class Proxy:
    """A forward proxy that answers 200 to everything it is asked (the worst a proxy can do: it
    would make a vLLM that is not ready look ready), counting what it was asked."""

    def __init__(self):
        self.asked: list[str] = []
        asked = self.asked

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                asked.append(self.path)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"proxied\n")

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def proxy_env(url: str) -> dict[str, str]:
    """What Docker puts in a container behind a proxy; no_proxy names nothing."""
    return {
        "http_proxy": url,
        "HTTP_PROXY": url,
        "https_proxy": url,
        "HTTPS_PROXY": url,
        "no_proxy": "",
        "NO_PROXY": "",
    }


def child_environ(pid: int) -> dict[str, str]:
    raw = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in raw if b"=" in e)


def test_a_proxy_answering_everything_never_makes_a_starting_vllm_ready(run, tmp_path):
    proxy = Proxy()
    try:
        r = run({"FAKE_READY_AFTER": "600", **proxy_env(proxy.url)})
        r.wait_for(lambda: r.state() == "STARTING")
        time.sleep(2.5)  # five of the observer's /health polls
        state = r.state()
        child = json.loads((tmp_path / "state.json").read_text())["child"]
        env = child_environ(child)
        r.signal(signal.SIGTERM)
        code, out, _ = r.finish()
    finally:
        proxy.close()
    assert proxy.asked == [], f"the supervisor asked the proxy: {proxy.asked}"
    assert state == "STARTING", out
    assert env.get("http_proxy") == proxy.url and env.get("no_proxy") == ""  # vLLM's: unchanged
    assert code in (0, 143), out


def test_a_dead_proxy_does_not_keep_a_ready_vllm_starting_nor_fail_probe(run):
    r = run(proxy_env(f"http://127.0.0.1:{free_port()}"))  # nothing listens there
    r.wait_for(lambda: r.state() == "SERVING")
    assert r.probe("ready") == 0 and r.probe("live") == 0  # the client command: no proxy either
    r.signal(signal.SIGTERM)
    code, out, _ = r.finish()
    assert code == 0, out


# -- a SIGTERM while PID 1 is starting ------------------------------------------------------------

NEEDS_UNSHARE = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare"
)


def blocked(pid: int, sig: int) -> bool:
    """`sig` is in the signal mask of `pid`'s main thread."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def pid1_of(unshare: subprocess.Popen) -> int:
    """The host pid of the namespace's init (unshare --fork's child)."""
    end = time.monotonic() + 5
    while time.monotonic() < end:
        children = psutil.Process(unshare.pid).children()
        if children:
            return children[0].pid
        time.sleep(0.001)
    raise AssertionError("unshare started no child")


@NEEDS_UNSHARE
@pytest.mark.parametrize("moment", ["at-mask", "0.2s", "spawned"])
def test_a_sigterm_at_any_moment_of_pid1_start_up_ends_it(tmp_path, moment):
    """The supervisor as PID 1 of its own PID namespace (the kernel drops a signal sent to PID 1 at
    its default action). `at-mask`: 0.05 s after the start, or as soon as SIGTERM is blocked
    if that is later (before that the interpreter is starting, and no Python program can hold a
    signal); `0.2s`: during the supervisor's own start-up (sweep, plan, checks); `spawned`: vLLM
    is starting. Before vLLM is spawned there is nothing to drain: exit 128+15 at once; after,
    vLLM's own code (the fake exits 0 on SIGTERM)."""
    port = free_port()
    env = fake_env(tmp_path, FAKE_READY_AFTER="600", FAKE_LOG=str(tmp_path / "fake.log"))
    argv = [sys.executable, str(ROOT / "entrypoint.py"), "serve", str(tmp_path / "model")]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", *argv, "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        init = pid1_of(proc)
        if moment == "at-mask":
            while time.monotonic() < t0 + 2 and not blocked(init, signal.SIGTERM):
                time.sleep(0.001)
            time.sleep(max(t0 + 0.05 - time.monotonic(), 0))
        elif moment == "0.2s":
            time.sleep(max(t0 + 0.2 - time.monotonic(), 0))
        else:
            while time.monotonic() < t0 + 30 and not fake_answers(port):
                time.sleep(0.01)
        sent = time.monotonic()
        os.kill(init, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=8)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            raise AssertionError(
                f"SIGTERM {sent - t0:.3f} s after the start was lost: PID 1 still runs\n{out}"
            ) from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    took = time.monotonic() - sent
    spawned = "vllm serve pid" in out
    print(f"{moment}: sent {sent - t0:.3f} s after start, exit {proc.returncode} in {took:.2f} s")
    if moment == "spawned":
        assert proc.returncode == 0 and "got SIGTERM" in _read(tmp_path / "fake.log"), out
    elif not spawned:
        assert proc.returncode == 128 + signal.SIGTERM, out
        assert "before vLLM was started" in out, out
    else:  # the start-up was over: vLLM got the stop (its handler or its default action)
        assert proc.returncode in (0, 128 + signal.SIGTERM), out
    assert took < 3, out


def _read(path: pathlib.Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


# -- a log reader that went away, or stopped reading ----------------------------------------------


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_closed_log_reader_does_not_cut_the_drain(run, tmp_path, log_format):
    """The reader of the supervisor's stdout and stderr (a log shipper, `| tee`) is gone when
    SIGTERM comes: every line written from then on is lost, the drain is not."""
    fake_log = tmp_path / "fake.log"
    r = run(
        {
            "INTEL_VLLM_LOG_FORMAT": log_format,
            "FAKE_DRAIN": "1.5",
            "FAKE_LOG": str(fake_log),
        }
    )
    r.wait_for(lambda: r.state() == "SERVING")
    r.proc.stdout.close()
    t0 = time.monotonic()
    r.signal(signal.SIGTERM)
    code = r.proc.wait(timeout=15)
    took = time.monotonic() - t0
    said = _read(fake_log)
    print(f"closed reader, {log_format}: exit {code} {took:.2f} s after SIGTERM")
    assert code == 0, f"exit {code} {took:.2f} s after SIGTERM; vLLM said:\n{said}"
    assert "got SIGTERM" in said and "drained, exit:0" in said, said
    assert 1.5 <= took < timing.deadline(1), took


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_full_log_pipe_does_not_stall_the_drain(tmp_path, log_format):
    """The reader is there but reads nothing (a stalled log shipper): the pipe is full from the
    start. The supervisor's lines (and in JSON mode vLLM's, which it relays) are dropped, the drain
    ends as usual. In text mode vLLM writes to the same pipe itself: the fake is quiet."""
    fake_log = tmp_path / "fake.log"
    port = free_port()
    env = fake_env(
        tmp_path,
        INTEL_VLLM_LOG_FORMAT=log_format,
        FAKE_DRAIN="1",
        FAKE_LOG=str(fake_log),
        FAKE_QUIET="1" if log_format == "text" else "0",
    )
    r, w = os.pipe()
    filler = os.open(f"/proc/self/fd/{w}", os.O_WRONLY | os.O_NONBLOCK)  # w itself stays blocking
    try:
        while True:
            os.write(filler, b"x" * 4096)
    except BlockingIOError:
        pass
    os.close(filler)
    argv = [sys.executable, str(ROOT / "entrypoint.py"), "serve", str(tmp_path / "model")]
    proc = subprocess.Popen([*argv, "--port", str(port)], env=env, stdout=w, stderr=w)
    os.close(w)
    try:
        state = tmp_path / "state.json"
        end = time.monotonic() + 30
        while time.monotonic() < end and '"SERVING"' not in _read(state):
            time.sleep(0.05)
        assert '"SERVING"' in _read(state), f"never SERVING: {_read(state)!r}"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=timing.deadline(1) + 2)
        except subprocess.TimeoutExpired:
            raise AssertionError("the supervisor stalled on its full log pipe") from None
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(r)
    said = _read(fake_log)
    print(f"full pipe, {log_format}: exit {code} {took:.2f} s after SIGTERM")
    assert code == 0, f"exit {code} {took:.2f} s after SIGTERM; vLLM said:\n{said}"
    assert "drained, exit:0" in said and took < timing.deadline(1), (took, said)


# -- every wait inside the deadline ---------------------------------------------------------------


def test_the_metrics_linger_after_a_forced_drain_ends_before_the_grace_period(run):
    """A forced drain (vLLM ignores SIGTERM: killed at the deadline, 10 s with a drain of 0) with
    requests in flight and a linger of 5 s: the orchestrator SIGKILLs at the end of the grace
    period (15 s), so the linger must end before it for the exit code to be 124, not 137."""
    r, port = serving(
        run,
        {
            "INTEL_VLLM_METRICS_LINGER_S": "5",
            "INTEL_VLLM_DRAIN_TIMEOUT": "0",
            "FAKE_RUNNING": "2",
            "FAKE_ON_TERM": "ignore",
        },
    )
    time.sleep(0.6)  # a /metrics sample: requests in flight
    t0 = time.monotonic()
    r.signal(signal.SIGTERM)
    try:
        r.proc.wait(timeout=timing.grace_period(0))  # what the orchestrator allows
    except subprocess.TimeoutExpired:
        r.proc.kill()  # what the orchestrator does then
        r.proc.wait()
    took = time.monotonic() - t0
    out = r.proc.stdout.read()
    print(f"linger after a forced drain: exit {r.proc.returncode} {took:.2f} s after SIGTERM")
    assert r.proc.returncode == 124, f"exit {r.proc.returncode} after {took:.1f} s\n{out}"
    assert took < timing.grace_period(0), took


# -- the run directory full or read-only, file descriptors exhausted, a slow child ----------------


def serve_in(tmp: pathlib.Path, *, mount: str = "", nofile: int = 0, env: dict | None = None):
    """entrypoint.py serve with TMPDIR=tmp/run: under `mount` (tmpfs options, in a mount namespace
    of its own: nothing outside sees it) and/or a file-descriptor limit of `nofile`."""
    import resource

    run_dir, model = tmp / "run", tmp / "model"
    run_dir.mkdir(exist_ok=True)
    model.mkdir(exist_ok=True)
    port = free_port()
    argv = [sys.executable, str(ROOT / "entrypoint.py"), "serve", str(model), "--port", str(port)]
    if mount:  # fill a writable mount first: a disk full before the supervisor starts
        fill = f"dd if=/dev/zero of={run_dir}/fill bs=4k 2>/dev/null;" if "ro" not in mount else ""
        script = f'mount -t tmpfs -o {mount} tmpfs {run_dir} && {fill} exec "$@"'
        argv = ["unshare", "--mount", "sh", "-c", script, "sh", *argv]

    def limit():
        if nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    full_env = dict(
        os.environ,
        PYTHONPATH=str(FAKE),
        TMPDIR=str(run_dir),
        INTEL_VLLM_DRAIN_TIMEOUT="1",
        INTEL_VLLM_PROBE_PORT=str(free_port()),
        **(env or {}),
    )
    proc = subprocess.Popen(
        argv,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=limit,
    )
    return proc, full_env


def ready(env: dict) -> bool:
    r = subprocess.run(
        [sys.executable, str(ROOT / "entrypoint.py"), "probe", "ready"],
        env=env,
        capture_output=True,
    )
    return r.returncode == 0


def stop_when_ready(proc, env, timeout: float = 30) -> tuple[int, float, str]:
    end = time.monotonic() + timeout
    while not ready(env):
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()[0]
        time.sleep(0.2)
    supervisor = proc.pid
    if os.path.basename(proc.args[0]) == "unshare":  # sh exec'd python in unshare's place
        supervisor = proc.pid
    t0 = time.monotonic()
    os.kill(supervisor, signal.SIGTERM)
    out, _ = proc.communicate(timeout=timing.grace_period(1))
    return proc.returncode, time.monotonic() - t0, out


@NEEDS_UNSHARE
def test_a_read_only_run_directory_is_refused_in_one_line(tmp_path):
    t0 = time.monotonic()
    proc, _ = serve_in(tmp_path, mount="ro,size=1m")
    out, _ = proc.communicate(timeout=30)
    took = time.monotonic() - t0
    print(f"read-only TMPDIR: exit {proc.returncode} after {took:.2f} s: {out.strip()}")
    assert proc.returncode == 64 and out.strip().count("\n") == 0, out
    assert "is not writable (Read-only file system)" in out and took < 10, (took, out)


@NEEDS_UNSHARE
def test_a_full_run_directory_still_serves_and_drains(tmp_path):
    """The supervisor's own files there are small (the run directory, its claims); a disk full
    before the start leaves them unwritten, and it serves and drains all the same."""
    proc, env = serve_in(tmp_path, mount="size=64k")
    code, took, out = stop_when_ready(proc, env)
    print(f"full TMPDIR: exit {code} {took:.2f} s after SIGTERM")
    assert code == 0 and took < timing.deadline(1), out
    assert "drained, exit:0" in out and "Traceback" not in out, out


@pytest.mark.parametrize("nofile", [8, 16])
def test_exhausted_file_descriptors_end_in_one_line_or_serve(tmp_path, nofile):
    """8: not even the probe port's socket or vLLM's pipes can be made: one line, 64 (the probe
    port cannot be served) or 126 (vLLM could not be executed); 16: enough for the supervisor and
    the child, which serve and drain as usual."""
    proc, env = serve_in(tmp_path, nofile=nofile)
    if nofile == 8:  # with the probe port: its socket is the one refused, a config error
        out, _ = proc.communicate(timeout=30)
        print(f"nofile 8: exit {proc.returncode}: {out.strip().splitlines()[-1]}")
        assert proc.returncode in (64, 126) and "Too many open files" in out, out
        assert "Traceback" not in out, out
        return
    code, took, out = stop_when_ready(proc, env)
    print(f"nofile {nofile}: exit {code} {took:.2f} s after SIGTERM")
    assert code == 0 and took < timing.deadline(1) and "Traceback" not in out, out


def test_a_slow_child_that_ignores_sigterm_is_killed_at_the_deadline(run):
    """vLLM still loading (never ready) and deaf to SIGTERM: the group is killed at the deadline
    and the supervisor exits 124 before the orchestrator's grace period ends."""
    r = run({"FAKE_READY_AFTER": "600", "FAKE_ON_TERM": "ignore", "INTEL_VLLM_DRAIN_TIMEOUT": "0"})
    r.wait_for(lambda: r.state() == "STARTING" and r.fake_answers())
    t0 = time.monotonic()
    r.signal(signal.SIGTERM)
    code, out, _ = r.finish(timeout=timing.grace_period(0))
    took = time.monotonic() - t0
    print(f"slow child deaf to SIGTERM: exit {code} {took:.2f} s after SIGTERM")
    assert code == 124 and timing.deadline(0) <= took < timing.grace_period(0), (took, out)
