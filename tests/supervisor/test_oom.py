"""An OOM kill is named in the exit line: which process of vLLM, the memory limit, what to change.
The supervisor reads its cgroup's OOM kill counter at vLLM's spawn and at the exit line: in a fake
cgroup tree (v2 memory.events, v1 memory.oom_control) that the fake child bumps before dying,
and, where the test may make a cgroup of its own, in a real one."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.harness import ROOT, free_port
from vllm_intel.supervisor import limits

from .conftest import fake_env
from .test_descendants import fake_with

# The loop in a process of its own (it blocks the signals it waits for), its cgroup root the fake
# tree; vLLM's stand-in bumps the tree's oom_kill counter, then dies as argv[3] says.
RUN = textwrap.dedent(
    """\
    import os, pathlib, sys
    from vllm_intel.supervisor import leftovers, limits, loop, settings

    tree, counter, how = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    oom_kills, read_limits = limits.oom_kills, limits.read_limits
    limits.oom_kills = lambda: oom_kills(tree, self_cgroup="0::/\\n4:memory:/")
    limits.read_limits = lambda: read_limits(tree, self_cgroup="0::/\\n4:memory:/")
    child = [sys.executable, "-c", CHILD, counter, how]
    cfg = settings.ServeConfig(argv=child, port=int(sys.argv[4]), drain=1, notes=[])
    sup = loop.Supervisor(cfg, pathlib.Path(sys.argv[5]), [leftovers.OomKills()])
    loop.Supervisor.block_signals()
    assert sup.spawn(dict(os.environ)) is None
    sys.exit(sup.run())
    """
)
CHILD = textwrap.dedent(
    """\
    import os, pathlib, re, signal, sys
    counter, how = pathlib.Path(sys.argv[1]), sys.argv[2]
    bump = lambda m: f"oom_kill {int(m.group(1)) + 1}"
    counter.write_text(re.sub(r"oom_kill (\\d+)", bump, counter.read_text()))
    if how == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(1)
    """
)


def fake_tree(root: pathlib.Path, version: str) -> pathlib.Path:
    """A cgroup tree with a 2 GiB memory limit and 3 OOM kills so far; its counter file."""
    if version == "v2":
        (root / "cgroup.controllers").write_text("cpu memory\n")
        (root / "memory.max").write_text(f"{2 << 30}\n")
        counter = root / "memory.events"
        counter.write_text("low 0\nhigh 0\nmax 9\noom 4\noom_kill 3\noom_group_kill 0\n")
    else:
        (root / "memory").mkdir()
        (root / "memory" / "memory.limit_in_bytes").write_text(f"{2 << 30}\n")
        counter = root / "memory" / "memory.oom_control"
        counter.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    return counter


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_the_counter_of_either_cgroup_version_is_read(tmp_path, version):
    counter = fake_tree(tmp_path, version)
    assert limits.oom_kills(tmp_path, self_cgroup="0::/\n4:memory:/") == 3
    counter.write_text("nothing here\n")
    assert limits.oom_kills(tmp_path, self_cgroup="0::/\n4:memory:/") is None
    assert limits.oom_kills(tmp_path / "missing", self_cgroup="") is None


def supervise(
    tmp_path: pathlib.Path, counter: pathlib.Path, how: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", RUN.replace("CHILD", repr(CHILD)), str(tmp_path), str(counter), how]
        + [str(free_port()), str(tmp_path / "state.json")],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "version, how, code, who",
    [
        ("v2", "killed", 128 + signal.SIGKILL, "vLLM's API server"),
        ("v1", "exits", 70, "a process of vLLM (engine core / worker)"),
    ],
)
def test_an_oom_kill_is_named_in_the_exit_line(tmp_path, version, how, code, who):
    r = supervise(tmp_path, fake_tree(tmp_path, version), how)
    assert r.returncode == code, r.stderr[-3000:]  # the exit-code contract, unchanged
    (line,) = [x for x in r.stderr.splitlines() if f"exit {code}:" in x]
    assert f"the kernel's OOM killer killed {who} at the memory limit of 2.0 GiB" in line, line
    assert "docker run --memory" in line and "VLLM_CPU_KVCACHE_SPACE" in line, line


def test_without_an_oom_kill_the_exit_line_names_none(tmp_path):
    fake_tree(tmp_path, "v2")
    elsewhere = tmp_path / "elsewhere"  # the child bumps another counter than the supervisor's
    elsewhere.write_text("oom_kill 0\n")
    r = supervise(tmp_path, elsewhere, "killed")
    assert r.returncode == 128 + signal.SIGKILL, r.stderr[-3000:]
    assert "OOM" not in r.stderr, r.stderr


# -- a real OOM kill, in a memory cgroup of the test's own ------------------------------------------

# Once TRIGGER exists, vLLM's stand-in (or a "worker" of it, then the stand-in exits 1 as vLLM
# does when its engine dies) allocates until the kernel kills it.
GREEDY = """
import os, subprocess, sys, threading, time
EAT = "chunks = []\\nwhile True: chunks.append(b'x' * (16 << 20))"
def greedy():
    while not os.path.exists(TRIGGER):
        time.sleep(0.05)
    if WHO == "worker":
        subprocess.run([sys.executable, "-c", EAT])
        os._exit(1)
    exec(EAT)
threading.Thread(target=greedy, daemon=True).start()
"""
SMALL = 256 << 20


def memory_cgroup(name: str) -> tuple[pathlib.Path, str]:
    """A new memory cgroup below the test's own (its directory, its limit file); skips where the
    test may not make one."""
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    own = limits.own_paths(pathlib.Path("/proc/self/cgroup").read_text())
    if (limits.CGROUP_ROOT / "cgroup.controllers").exists():
        base, limit_file = limits.CGROUP_ROOT / own.get("", "/").lstrip("/"), "memory.max"
    else:
        base = limits.CGROUP_ROOT / "memory" / own.get("memory", "/").lstrip("/")
        limit_file = "memory.limit_in_bytes"
    path = base / name
    try:
        path.mkdir()
    except OSError as e:
        pytest.skip(f"cannot make a cgroup in {base}: {e}")
    if not (path / limit_file).exists():
        path.rmdir()
        pytest.skip(f"no memory controller in {path}")
    return path, limit_file


@pytest.mark.parametrize("who", ["api-server", "worker"])
def test_a_real_oom_kill_is_named(tmp_path, who):
    cgroup, limit_file = memory_cgroup(f"vllm-intel-oom-{os.getpid()}-{who}")
    trigger = tmp_path / "allocate"
    prelude = f"TRIGGER = {str(trigger)!r}\nWHO = {who!r}\n{GREEDY}"
    env = {**fake_env(tmp_path), **fake_with(tmp_path, prelude)}
    serve = [sys.executable, str(ROOT / "entrypoint.py"), "serve", str(tmp_path / "model")]
    # the supervisor joins the cgroup before it execs, so vLLM's processes are in it from the start
    join = f'echo $$ > {cgroup / "cgroup.procs"} && exec "$@"'
    proc = subprocess.Popen(
        ["sh", "-c", join, "sh", *serve, "--port", str(free_port())],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        end = time.monotonic() + 30
        while '"SERVING"' not in _read(tmp_path / "state.json") and time.monotonic() < end:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.05)
        # small only now: the supervisor's plan refuses to start vLLM in a cgroup this small
        (cgroup / limit_file).write_text(str(SMALL))
        trigger.touch()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for _ in range(100):
            try:
                cgroup.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    code, named = (137, "vLLM's API server") if who == "api-server" else (70, "a process of vLLM")
    assert proc.returncode == code, out
    line = next(x for x in out.splitlines() if f"exit {code}:" in x)
    assert f"the kernel's OOM killer killed {named}" in line, line
    assert f"at the memory limit of {SMALL >> 20} MiB" in line, line


def _read(path: pathlib.Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
