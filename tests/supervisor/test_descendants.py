"""At its exit the supervisor ends every process vLLM left, in its process group or not: a process
that called setsid is no longer in the group, and is re-parented to the supervisor (a subreaper)."""

from __future__ import annotations

import os
import pathlib
import signal
import textwrap

import psutil

from .conftest import FAKE


def fake_with(tmp_path: pathlib.Path, prelude: str) -> dict[str, str]:
    """The environment of a fake vLLM that runs `prelude` (Python) first, then fake_vllm's own
    `vllm serve`: a package of its own in `tmp_path`, first on PYTHONPATH."""
    cli = tmp_path / "pkg" / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for package in (cli, cli.parent, cli.parent.parent):
        (package / "__init__.py").write_text("")
    main = FAKE / "vllm" / "entrypoints" / "cli" / "main.py"
    (cli / "main.py").write_text(
        f"{textwrap.dedent(prelude)}\nimport runpy\nrunpy.run_path({str(main)!r}, run_name='__main__')\n"
    )
    return {"PYTHONPATH": str(tmp_path / "pkg")}


# A process of vLLM in a session of its own that ignores SIGTERM (its pid in PID_FILE).
ESCAPED = """
import subprocess, sys
subprocess.Popen(
    [sys.executable, "-c", "import os, signal, sys, time; signal.signal(signal.SIGTERM, "
     "signal.SIG_IGN); open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)", PID_FILE],
    start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
"""


def test_a_process_of_vllm_outside_its_group_is_ended_and_reaped(run, tmp_path):
    pid_file = tmp_path / "escaped.pid"
    r = run(fake_with(tmp_path, f"PID_FILE = {str(pid_file)!r}\n{ESCAPED}"))
    r.wait_for(lambda: r.state() == "SERVING" and pid_file.exists() and pid_file.read_text())
    escaped = psutil.Process(int(pid_file.read_text()))
    try:
        assert os.getpgid(escaped.pid) == escaped.pid  # not in vLLM's process group
        r.signal(signal.SIGTERM)
        code, out, _ = r.finish()
        assert code == 0, out
        # reaped by the supervisor: gone, not a zombie waiting for init
        assert not escaped.is_running(), (escaped.status(), out)
        assert "1 process(es) of vLLM outside its process group" in out, out
        assert f"{escaped.pid} python" in out and "SIGKILL" in out, out
    finally:
        if escaped.is_running():
            escaped.kill()
