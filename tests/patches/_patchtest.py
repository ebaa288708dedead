"""Subprocess helpers for the patch tests (a module, not conftest: `conftest` is ambiguous
when several test directories have one)."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap


def run_py(python, code: str, env: dict | None = None, timeout: float = 600, cwd=None):
    full_env = dict(os.environ, **(env or {}))
    # Plain snippets must see neither our checkout's nor the user's site customisations.
    return subprocess.run(
        [str(python), "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd or "/",
    )


def run_json(python, code: str, env: dict | None = None, timeout: float = 600):
    cp = run_py(python, code, env, timeout)
    lines = cp.stdout.strip().splitlines()
    assert cp.returncode == 0 and lines, (
        f"exit {cp.returncode}\n--- stdout\n{cp.stdout[-3000:]}\n--- stderr\n{cp.stderr[-6000:]}"
    )
    return json.loads(lines[-1])
