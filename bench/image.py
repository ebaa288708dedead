"""image: the CPU image's size against its Python environment, and a rebuild after a code change.

- size: `docker image inspect` Size of vllm-intel:cpu vs `du -sb /opt/venv` inside it (goal <= 1.1).
- rebuild: scripts/build-image.sh cpu run on a copy of the build inputs (bench/results/context,
  never the tracked files) tagged vllm-intel:bench-rebuild. The first build of the unchanged copy
  must come from the build cache (else "not measured": the copy does not reproduce the cache keys).
  Then per repeat: A = a code-only change (a comment appended to the copy's entrypoint.py, new each
  time) and B = the same build again with nothing changed (the floor of a build).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

from .common import RESULTS, ROOT, Row, log, record
from .dockerutil import IMAGE, docker, engine

# What the runtime target reads from the context (Dockerfile.cpu's COPY and bind mounts).
INPUTS = (
    "docker",
    "tools",
    "vllm_intel",
    "patches",
    "scripts",
    "pyproject.toml",
    "entrypoint.py",
    "VLLM_VERSION",
    ".dockerignore",
)
TAG = "vllm-intel:bench-rebuild"
CACHED_LIMIT_S = 300  # an unchanged copy that takes longer is rebuilding vLLM: give up


def copy_context() -> os.PathLike:
    ctx = RESULTS / "context"
    shutil.rmtree(ctx, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in INPUTS:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, ctx / name, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, ctx / name)
    return ctx


def build(ctx, timeout: float) -> tuple[float, list[str]]:
    """Seconds the build took and the steps it ran (not CACHED), from BuildKit's plain progress."""
    env = dict(os.environ, TAG=TAG)
    t = time.monotonic()
    r = subprocess.run(
        ["bash", str(ctx / "scripts" / "build-image.sh"), "cpu"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    took = time.monotonic() - t
    if r.returncode != 0:
        raise RuntimeError(f"build failed: {r.stderr[-1500:]}")
    steps, cached = {}, set()
    for line in r.stderr.splitlines():
        m = re.match(r"#(\d+) (\[.*)$", line)
        if m and m.group(1) not in steps:
            steps[m.group(1)] = m.group(2)[:70]
        m = re.match(r"#(\d+) CACHED", line)
        if m:
            cached.add(m.group(1))
    ran = [
        v
        for k, v in steps.items()
        if k not in cached and "internal]" not in v and " FROM " not in v
    ]
    return took, ran


def not_measured(figure: str, unit: str, why: str, goal: str = "") -> Row:
    return Row("image", figure, unit, ["not measured"], [], [], goal, None, note=why)


def run(repeat: int, quick: bool) -> list[Row]:
    host, why = engine()
    if host is None:
        return [
            not_measured("image size / venv size", "", why, goal="<= 1.1"),
            not_measured("rebuild after a code-only change", "s", why),
        ]
    size = int(docker("image", "inspect", "-f", "{{.Size}}", IMAGE).stdout.strip())
    du = docker("run", "--rm", "--entrypoint", "du", IMAGE, "-sb", "/opt/venv", timeout=300)
    venv = int(du.stdout.split()[0])
    hist = docker("history", "--no-trunc", "--format", "{{.Size}}\t{{.CreatedBy}}", IMAGE).stdout
    big = [
        f"{size_s} {created.split('/bin/sh -c ')[-1][:60].strip() or '(base image)'}"
        for size_s, created in (l.split("\t", 1) for l in hist.splitlines() if "\t" in l)
        if size_s.endswith("GB") or (size_s.endswith("MB") and float(size_s[:-2]) >= 10)
    ]
    rows = [
        Row(
            "image",
            "image size vs /opt/venv size",
            "GB",
            [size / 1e9],
            [venv / 1e9],
            [size / venv],
            "ratio <= 1.1",
            size / venv <= 1.1,
            note=f"{IMAGE}: image {size} B, du -sb /opt/venv {venv} B; layers >= 10 MB: "
            + "; ".join(big),
        )
    ]
    ctx = copy_context()
    changed = {"entrypoint": [], "patches": []}
    floor = {"entrypoint": [], "patches": []}
    ran_changed, ran_floor = {}, []
    try:
        try:
            first, ran = build(ctx, CACHED_LIMIT_S)
            log(f"unchanged copy built in {first:.1f} s; steps run: {ran}")
        except subprocess.TimeoutExpired:
            rows.append(
                not_measured(
                    "rebuild after a code-only change",
                    "s",
                    "the copy of the context missed the build "
                    f"cache (> {CACHED_LIMIT_S} s): it would rebuild vLLM",
                )
            )
            return rows
        for rep in range(repeat):
            for key, path in (
                ("entrypoint", "entrypoint.py"),
                ("patches", "patches/__init__.py"),
            ):
                with open(ctx / path, "a") as f:
                    f.write(f"# bench rebuild {time.time()} {rep}\n")
                took, ran = build(ctx, 1200)
                changed[key].append(took)
                ran_changed[key] = ran
                inside = (
                    "/opt/vllm-intel/entrypoint.py"
                    if key == "entrypoint"
                    else "/opt/venv/lib/python3.11/site-packages/vllm_intel/patches/__init__.py"
                )
                last = docker("run", "--rm", "--entrypoint", "tail", TAG, "-n1", inside).stdout
                if "bench rebuild" not in last or f" {rep}" not in last:
                    raise RuntimeError(f"the rebuilt image does not hold the change: {last!r}")
                took, ran_floor = build(ctx, 600)
                floor[key].append(took)
                record(
                    "rebuild",
                    {
                        "changed": path,
                        "code_change_s": changed[key][-1],
                        "no_change_s": floor[key][-1],
                        "steps_run": ran,
                    },
                )
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
        docker("rmi", TAG, check=False)
    for key, what in (
        ("entrypoint", "entrypoint.py"),
        ("patches", "the plugin, patches/"),
    ):
        rows.append(
            Row(
                "image",
                f"rebuild after a code-only change ({what})",
                "s",
                changed[key],
                floor[key],
                [],
                "",
                None,
                fmt="{:.1f}",
                note="alternative column = the same build again with nothing changed; "
                f"steps run after the change: {ran_changed.get(key, '-')}",
            )
        )
    return rows
