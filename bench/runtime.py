"""runtime: the CPU image's runtime under vLLM (memory allocator and OpenMP library) against
upstream vLLM's CPU image's and vLLM's own default (Docker only).

Upstream's CPU image runs vLLM with `LD_PRELOAD=` tcmalloc and Intel OpenMP (UPSTREAM_PRELOAD);
without a preload vLLM itself preloads torch's GNU OpenMP into its processes and allocates with
glibc's malloc. Our image's entrypoint preloads what its CPU plan finds (the plan line says
which). Four arms (`--runtime-arms` picks), each a container of the CPU image serving a real
shape of tools/build_model.py (mounted read-only like `limits --limits-shape`: limits.served), in
vLLM's default mode (torch.compile), `--max-model-len 4096`, `--shm-size 1g`, `--memory` and
`--memory-swap` HEADROOM_MIB above the plan's edge for a 1 GiB KV cache:
- bare:     `--entrypoint /opt/venv/bin/vllm serve ...` with VLLM_PLUGINS=none (no plugin) and
            VLLM_CPU_KVCACHE_SPACE=1: vLLM's default runtime, no LD_PRELOAD;
- upstream: bare with upstream's LD_PRELOAD;
- ours:     the image's entrypoint and its CPU plan (threads, the KV cache from the memory limit,
            the preload);
- ours-spin: ours with vLLM's spinning shm readers kept (VLLM_SHM_BROADCAST_BUSY_SLEEP_S=0):
            against ours, what the plan's waiting readers cost or gain.
bare and upstream get TORCHINDUCTOR_CACHE_DIR under the mounted cache (the entrypoint sets its
own there): each arm kind has a host directory of its own at /home/vllm/.cache for the run, so
its later starts (the next CPU setting) reuse the kernels its first start compiled.

Two CPU settings, each a start of the three arms of its own (`--runtime-quota both|off|on`):
`noquota` (the host's CPUs) and `quota` (`--cpus 1`; bare and upstream keep vLLM's own thread
choice, ours takes its plan's). The arms are started one after the other, each gets one warm-up request, then
the rounds rotate the arms' order, and while one arm is measured the others are paused
(limits.alone). Per round and arm: tokens/s of 1, 4 and 16 concurrent streams (common.curl_batch,
one `curl` per stream; the token counts keep each load to a few seconds at the shape's and
setting's speed: load_tokens), and a prefill-heavy load: 2 concurrent requests of ~1000 prompt
tokens and one output token each, as prompt tokens per second (the count from the streams' usage
chunks). The long prompts repeat a line of Python and start with a tag unique to the round and
stream: vLLM's prefix cache (on by default) then serves none of them from an earlier one. Also
per arm: time to ready, peak memory (cgroup) and the memory in use at the end, which of tcmalloc
and Intel OpenMP each of its processes has mapped (read on the host), ours' plan line.

Rows per shape, setting and load: ours / upstream (goal >= 0.97: our runtime is at least as fast
as upstream's, within the noise of a pair), upstream / bare and ours / bare (what a preload
buys), each with its per-round ratios; at 1 and 4 streams ours against the memory-bandwidth
bound, the host's read bandwidth measured at the start of the same run (bound.py; goal >= 0.70); peak memory ours vs upstream and vs bare; time to ready.
Shapes: qwen2.5-0.5b and llama-3.2-1b (`--runtime-shapes`); `--quick`: qwen2.5-0.5b, noquota, 2
rounds.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shutil
import statistics
import tempfile
import time

import psutil

from . import bound, limits, real
from .common import RESULTS, ROOT, Row, curl_batch, log, pair_ratios, record
from .dockerutil import IMAGE, docker, engine

SECTION = "runtime"
SHAPES = ("qwen2.5-0.5b", "llama-3.2-1b")
SHAPES_QUICK = ("qwen2.5-0.5b",)
KINDS = ("bare", "upstream", "ours", "ours-spin")
SETTINGS = {"noquota": (), "quota": ("--cpus", "1")}
QUOTA = {"both": ("noquota", "quota"), "off": ("noquota",), "on": ("quota",)}
UPSTREAM_PRELOAD = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4:/opt/venv/lib/libiomp5.so"
VLLM = "/opt/venv/bin/vllm"
CACHE = "/home/vllm/.cache"  # HOME's cache in the image: vLLM's, torch's and the entrypoint's
START_TIMEOUT_S = real.START_TIMEOUT_S
GOAL = "ratio >= 0.97"
# (the row's arm, the arm it is compared with, the goal)
PAIRS = (
    ("ours", "upstream", GOAL),
    ("upstream", "bare", ""),
    ("ours", "bare", ""),
    ("ours-spin", "upstream", ""),
    ("ours", "ours-spin", ""),
)
# ours-spin: ours with vLLM's spinning shm readers (the plan makes them wait on a host with no
# CPU to spare beside vLLM's OpenMP threads, or under a quota): what that wait costs or gains.
SPIN_KEPT = ("-e", "VLLM_SHM_BROADCAST_BUSY_SLEEP_S=0")

# Streams and tokens per stream on the 0.5B shape with 2 CPUs; load_tokens scales the tokens
# by the shape's and the setting's speed so that every load lasts a few seconds.
STREAM_LOADS = {"1 stream": (1, 48), "4 streams": (4, 48), "16 streams": (16, 24)}
SPEED = {"qwen2.5-0.5b": 1.0, "llama-3.2-1b": 0.5}  # tokens/s relative to the 0.5B shape
QUOTA_SPEED = 0.5  # one CPU of two
MIN_TOKENS = 8
PREFILL = "prefill, 2 x ~1000-token prompts"
PREFILL_STREAMS = 2
# 14 tokens a line, repeated, in tools/build_model.py's tokenizer (both shapes'): 71 lines and
# the tag are about 1000 tokens; the streams' usage chunks give each measurement's exact count.
PROMPT_LINE = "for item in items:\n    total += item.value\n"
PROMPT_LINES = 71
WARM_UP_TOKENS = 16
# the libraries a preload can bring, as named in /proc/PID/maps
MAPPED = {"tcmalloc": "libtcmalloc", "iomp5": "libiomp5"}


def shape_list(chosen: str | None, quick: bool) -> tuple[str, ...]:
    """The shapes `--runtime-shapes` picks (default SHAPES; --quick: SHAPES_QUICK)."""
    if chosen:
        return tuple(s.strip() for s in chosen.split(",") if s.strip())
    return SHAPES_QUICK if quick else SHAPES


def settings(quota: str | None, quick: bool) -> tuple[str, ...]:
    """The CPU settings `--runtime-quota` picks (default both; --quick: off)."""
    if quota is None:
        quota = "off" if quick else "both"
    if quota not in QUOTA:
        raise ValueError(f"--runtime-quota must be one of {', '.join(QUOTA)}, not {quota!r}")
    return QUOTA[quota]


def rounds(repeat: int, quick: bool) -> int:
    """6 at least: fewer pairs give no 95 % interval (bench/stats.py)."""
    return 2 if quick else max(6, 2 * repeat)


def arm_list(chosen: str | None) -> tuple[str, ...]:
    """The arm kinds `--runtime-arms` picks, in KINDS' order; ours and upstream always run."""
    if not chosen:
        return KINDS
    picked = {k.strip() for k in chosen.split(",") if k.strip()} | {"ours", "upstream"}
    if unknown := picked - set(KINDS):
        raise ValueError(
            f"unknown runtime arm(s) {sorted(unknown)}; choose from {', '.join(KINDS)}"
        )
    return tuple(k for k in KINDS if k in picked)


def load_tokens(shape: str, setting: str) -> dict[str, tuple[int, int]]:
    """load -> (concurrent streams, tokens per stream) for a shape in a CPU setting."""
    scale = SPEED.get(shape, 1.0) * (QUOTA_SPEED if setting == "quota" else 1.0)
    return {
        load: (n, max(MIN_TOKENS, round(tokens * scale)))
        for load, (n, tokens) in STREAM_LOADS.items()
    }


def long_prompts(n: int, tag: str) -> list[str]:
    """n prompts of ~1000 tokens that share no prefix with each other or with any other tag's."""
    return [f"# {tag}-{i:02d}\n" + PROMPT_LINE * PROMPT_LINES for i in range(n)]


def docker_args(kind: str, setting: str, what: limits.Served, cache_dir: str) -> list[str]:
    """`docker run`'s options of an arm (the name, port and image are the Container's)."""
    if kind not in KINDS:
        raise ValueError(f"unknown runtime arm {kind!r}; choose from {', '.join(KINDS)}")
    args = [*limits.COMMON, *what.docker_args, *SETTINGS[setting], "-v", f"{cache_dir}:{CACHE}"]
    if kind in ("bare", "upstream"):
        args += ["--entrypoint", VLLM, "-e", "VLLM_PLUGINS=none", "-e", "VLLM_CPU_KVCACHE_SPACE=1"]
        args += ["-e", f"TORCHINDUCTOR_CACHE_DIR={CACHE}/torchinductor"]
    if kind == "upstream":
        args += ["-e", f"LD_PRELOAD={UPSTREAM_PRELOAD}"]
    if kind == "ours-spin":
        args += SPIN_KEPT
    return args


def command(kind: str, what: limits.Served) -> list[str]:
    """The container's command: `serve MODEL FLAGS`, to vllm (bare, upstream) or the entrypoint."""
    return ["serve", *what.serve_args]


class Arm(limits.Arm):
    """A container of the image for one arm kind in one CPU setting."""

    section = SECTION

    def __init__(self, kind: str, setting: str, what: limits.Served, cache_dir: str):
        self.setting, self.cache_dir = setting, cache_dir
        super().__init__(kind, what)

    def run_args(self) -> list[str]:
        return docker_args(self.kind, self.setting, self.what, self.cache_dir)

    def command(self) -> list[str]:
        return command(self.kind, self.what)

    def start(self) -> None:
        self.ready_s = round(self.wait_ready(START_TIMEOUT_S), 1)
        text = self.logs()
        found = re.findall(r"\[entrypoint\] (plan:[^\n]*)", text)
        self.plan = found[0] if found else "no plan line"
        self.cache = real.cache_line(text)
        self.libs = self.mapped_libs()
        m = self.load(1, WARM_UP_TOKENS, long_prompts(1, "warm-up"))
        if not m["ok"]:
            raise RuntimeError(f"{self.kind}: the warm-up request failed: {m}")
        self.warm_up_prompt_tokens = m["prompt_tokens"]
        log(
            f"{self.kind} ({self.setting}): ready in {self.ready_s} s; "
            f"{self.plan if self.kind == 'ours' else ''} mapped: {self.libs}; warm-up prompt "
            f"{m['prompt_tokens']} tokens, {m['prompt_tok_s']} prompt tokens/s"
        )

    def mapped_libs(self) -> str:
        """Which of MAPPED each process in the container has mapped (its /proc/PID/maps, read on
        the host), by process name: what the preload (or its absence) put into vLLM."""
        pid = int(docker("inspect", "-f", "{{.State.Pid}}", self.name).stdout.strip())
        seen: dict[str, set[str]] = {}
        try:
            procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return "unknown (the container's processes are gone)"
        for p in procs:
            try:
                maps = pathlib.Path(f"/proc/{p.pid}/maps").read_text()
                name = p.name()
            except (OSError, psutil.Error):
                continue
            libs = {lib for lib, pattern in MAPPED.items() if pattern in maps}
            seen.setdefault(name, set()).update(libs)
        if not seen:
            return "unknown (/proc/PID/maps not readable)"
        return "; ".join(f"{n}: {'+'.join(sorted(libs)) or 'neither'}" for n, libs in seen.items())

    def load(self, n: int, tokens: int, prompts: list[str] | None = None) -> dict:
        """curl_batch of n streams (the long `prompts` if given), with the container's CPU time
        (cgroup) per token and the share of CFS periods it was throttled in."""
        p0 = self.throttle()
        kw = {"prompt": prompts} if prompts else {}
        got = curl_batch(self.url, self.what.model, self.tmp, n, tokens, self.cpu_s, **kw)
        p1 = self.throttle()
        got["throttled"] = round((p1[1] - p0[1]) / max(1, p1[0] - p0[0]), 3)
        return got

    def figures(self) -> dict:
        """What the rows report of this start beside the rounds."""
        return {
            "ready_s": self.ready_s,
            "peak_mib": self.peak_mib(),
            "memory_mib": self.memory_split_mib(),
            "mapped": self.libs,
            "plan": self.plan,
            "compile_cache": self.cache,
            "warm_up_prompt_tokens": self.warm_up_prompt_tokens,
        }

    def running(self) -> bool:
        out = docker("inspect", "-f", "{{.State.Running}}", self.name, check=False)
        return out.stdout.strip() == "true"


def run(
    repeat: int,
    quick: bool,
    shapes: str | None = None,
    quota: str | None = None,
    arms: str | None = None,
    starts: int = 1,
) -> list[Row]:
    """`shapes`: comma-separated shapes of tools/build_model.py (default SHAPES; --quick:
    SHAPES_QUICK). `quota`: both, off (noquota only) or on (quota only); default both, --quick
    off. `arms`: comma-separated arm kinds (default all KINDS; ours and upstream always run).
    `starts`: the arms are started this many times per shape and setting (measure)."""
    chosen, cpu, kinds = shape_list(shapes, quick), settings(quota, quick), arm_list(arms)
    if starts < 1:
        raise ValueError(f"--runtime-starts must be at least 1, not {starts}")
    host, why = engine()
    if host is None:
        return [Row(SECTION, "CPU runtime, ours vs upstream's", note=f"not measured: {why}")]
    n_rounds = rounds(repeat, quick)
    build = ROOT / "build"
    build.mkdir(exist_ok=True)
    # Under build/, not /tmp: the engine mounts it (as it mounts the models there).
    caches_root = pathlib.Path(tempfile.mkdtemp(prefix="bench-runtime-caches-", dir=build))
    caches = {}
    for kind in KINDS:
        caches[kind] = caches_root / kind
        caches[kind].mkdir()
        caches[kind].chmod(0o777)  # the image's user (uid 10001) writes there
    rows: list[Row] = []
    bandwidth = bound.read_bandwidth()  # before any arm runs: the host quiet
    log(f"runtime: read bandwidth {bandwidth / 1e9:.1f} GB/s")
    try:
        for shape in chosen:
            what = with_headroom(limits.served(shape))
            for i, setting in enumerate(cpu):
                t0 = time.monotonic()
                try:
                    got = measure(shape, setting, what, caches, n_rounds, kinds, starts)
                except Exception as e:  # one broken setting must not cost the others' rows
                    log(f"runtime {shape} {setting}: {type(e).__name__}: {e}")
                    why = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                    rows.append(
                        Row(SECTION, f"{shape}, {setting}", met=False, note=f"failed: {why}")
                    )
                    continue
                got["first_start"] = i == 0
                got["bandwidth"] = bandwidth
                got["step_bytes"] = bound.bytes_per_step(real.model(shape))
                rows += _rows(shape, setting, got, what)
                log(f"runtime {shape} {setting} took {time.monotonic() - t0:.0f} s")
    finally:
        _remove_caches(caches_root)
    return rows


# Above the plan's edge for a 1 GiB KV cache, below the edge of 2 GiB (ours keeps 1 GiB): vLLM's
# own check before it allocates the KV cache counts the container's page cache as used, so at the
# edge a bare arm started on an earlier start's compile cache can fail it ("Available memory on
# node 0 ... is less than requested memory for kv"). The edge itself is the container tests'
# (tests/container/test_real_shape.py).
HEADROOM_MIB = 512


def with_headroom(what: limits.Served) -> limits.Served:
    """`what` with every arm's --memory / --memory-swap raised by HEADROOM_MIB."""
    args = list(what.docker_args)
    for flag in ("--memory", "--memory-swap"):
        i = args.index(flag) + 1
        args[i] = f"{int(args[i].removesuffix('m')) + HEADROOM_MIB}m"
    return dataclasses.replace(what, docker_args=tuple(args))


def measure(
    shape: str,
    setting: str,
    what: limits.Served,
    caches: dict,
    n_rounds: int,
    kinds=KINDS,
    starts: int = 1,
) -> dict:
    """The arms started one after the other, then rounds of every load: n_rounds in all, split
    between `starts` starts of fresh containers (the start order rotated), so that what differs
    from one container start to the next (a start can be slow for its whole life) varies inside
    the intervals instead of fixing the run's ratio."""
    loads = load_tokens(shape, setting)
    per_start = -(-n_rounds // starts)
    got: dict = {(kind, load): [] for kind in kinds for load in [*loads, PREFILL]}
    out: dict = {"shape": shape, "setting": setting, "loads": loads, "rounds": per_start * starts}
    out["kinds"], out["starts"] = list(kinds), []
    for s in range(starts):
        order = [*kinds[s % len(kinds) :], *kinds[: s % len(kinds)]]
        arms: list[Arm] = []
        try:
            for kind in order:
                cache = start_cache(caches, kind, s, starts)
                arms.append(Arm(kind, setting, what, str(cache)))  # removed below if it fails
                arms[-1].start()
            for k in range(s * per_start, (s + 1) * per_start):
                measure_round(f"runtime {shape} {setting}", loads, arms, k, got)
            out["starts"].append({a.kind: a.figures() for a in arms})
        finally:
            for a in arms:
                log_file = f"runtime-{a.name}-{shape}-{setting}-start{s}.log"
                a.remove(keep_log=RESULTS / "logs" / log_file)
                shutil.rmtree(a.tmp, ignore_errors=True)
        out.update(out["starts"][-1])  # each kind's figures of its last start: the rows'
    out.update({f"{kind} {load}": v for (kind, load), v in got.items()})
    record(f"runtime {shape} {setting}", out)
    out["got"] = got
    return out


def start_cache(caches: dict, kind: str, start: int, starts: int) -> pathlib.Path:
    """The arm's compile cache for one start: its kind's cache for the run, or with several
    starts a fresh one per start (what a start compiles is part of what differs between starts)."""
    if starts == 1:
        return caches[kind]
    path = caches[kind] / f"start-{start}"
    path.mkdir(exist_ok=True)
    path.chmod(0o777)  # the image's user (uid 10001) writes there
    return path


def measure_round(label: str, loads: dict, arms: list, k: int, got: dict) -> None:
    """Round k: every load on every arm (the order rotated by k, the others paused), appended to
    got[(kind, load)]."""
    turn = arms[k % len(arms) :] + arms[: k % len(arms)]
    for load in [*loads, PREFILL]:
        n, tokens = loads[load] if load in loads else (PREFILL_STREAMS, 1)
        prompts = long_prompts(n, f"r{k:03d}") if load == PREFILL else None
        for a in turn:
            with limits.alone(a, arms):
                m = a.load(n, tokens, prompts)
            log(f"{label} round {k}: {a.kind}, {load}: {m}")
            if not m["ok"] and not a.running():
                raise RuntimeError(f"{a.kind} exited:\n{a.logs()[-2000:]}")
            got[(a.kind, load)].append(m)


def _values(runs: list[dict], key: str) -> list:
    """One value per round, None where the measurement failed (keeps the rounds paired)."""
    return [m.get(key) if m.get("ok") else None for m in runs]


def _med(values: list) -> str:
    xs = [v for v in values if isinstance(v, (int, float))]
    return f"{statistics.median(xs):.2f}" if xs else "-"


def per_start(ours: list, alt: list, starts: int) -> str:
    """The paired ratio's median within each start's rounds: with several starts, how far one
    start's ratio strays from the next (the spread the intervals take in)."""
    n = len(ours) // starts
    medians = []
    for s in range(starts):
        ratios = pair_ratios(ours[s * n : (s + 1) * n], alt[s * n : (s + 1) * n])
        medians.append(f"{statistics.median(ratios):.3f}" if ratios else "-")
    return " / ".join(medians)


def _rows(shape: str, setting: str, got: dict, what: limits.Served) -> list[Row]:
    rows = []
    label = f"{shape}, {setting}"
    per_round = got["got"]
    kinds = got.get("kinds", KINDS)
    starts = max(len(got.get("starts", [])), 1)
    for load in [*got["loads"], PREFILL]:
        key, unit = (
            ("prompt_tok_s", "prompt tokens/s") if load == PREFILL else ("tok_s", "tokens/s")
        )
        value = {kind: _values(per_round[(kind, load)], key) for kind in kinds}
        throttled = {kind: _values(per_round[(kind, load)], "throttled") for kind in kinds}
        failed = {kind: value[kind].count(None) for kind in kinds if None in value[kind]}
        if load == PREFILL:
            # per prompt token: the batch's CPU over its prompt tokens (cpu_ms is per output token)
            cpu_ms = {
                kind: [
                    m["cpu_ms"] * PREFILL_STREAMS / m["prompt_tokens"]
                    if m.get("ok") and m.get("prompt_tokens")
                    else None
                    for m in per_round[(kind, load)]
                ]
                for kind in kinds
            }
            counts = sorted(
                {m["prompt_tokens"] for k in kinds for m in per_round[(k, load)] if m.get("ok")}
            )
            span = "?" if not counts else "-".join(map(str, sorted({counts[0], counts[-1]})))
            what_ran = f"{PREFILL_STREAMS} prompts, {span} prompt tokens a batch (usage chunks)"
            what_ran += ", 1 output token each; CPU ms per prompt token"
        else:
            cpu_ms = {kind: _values(per_round[(kind, load)], "cpu_ms") for kind in kinds}
            n, tokens = got["loads"][load]
            what_ran = f"{n} x {tokens} tokens; CPU ms per token"
        for ours, alt, goal in [pair for pair in PAIRS if {pair[0], pair[1]} <= set(kinds)]:
            note = (
                f"{what_ran} {_med(cpu_ms[ours])} vs {_med(cpu_ms[alt])}"
                + (
                    f"; throttled in {_med(throttled[ours])} vs {_med(throttled[alt])} of CFS "
                    "periods"
                    if setting == "quota"
                    else ""
                )
                + f"; {got['rounds']} rounds"
                + (
                    f"; ratio per start {per_start(value[ours], value[alt], starts)}"
                    if starts > 1
                    else ""
                )
                + (f"; failed measurements {failed}" if failed else "")
            )
            rows.append(
                Row(
                    SECTION,
                    f"{label}, {load}: {ours} vs {alt}",
                    unit,
                    [v for v in value[ours] if v is not None],
                    [v for v in value[alt] if v is not None],
                    pair_ratios(value[ours], value[alt]),
                    goal,
                    None,  # a goal is judged by its interval (bench/__main__.py)
                    note=note,
                    fmt="{:.1f}",
                )
            )
    rows += bound_rows(label, got)
    arm = {kind: got[kind] for kind in kinds}
    args = list(what.docker_args)
    memory = args[args.index("--memory") + 1] if "--memory" in args else "none"
    if got["first_start"]:
        start = "the arms' first start in this run: they compile"
    else:
        start = "a later start: each arm reuses what its first start compiled"
    ready = {kind: arm[kind]["ready_s"] for kind in kinds}
    rows.append(
        Row(
            SECTION,
            f"{label}: time to ready, ours vs upstream",
            "s",
            [ready["ours"]],
            [ready["upstream"]],
            pair_ratios([ready["ours"]], [ready["upstream"]]),
            note=f"{ready}; {start}; ours: {arm['ours']['compile_cache']}",
            fmt="{:.1f}",
        )
    )
    peak = {kind: arm[kind]["peak_mib"] for kind in kinds}
    in_use = ", ".join(f"{k} {arm[k]['memory_mib']}" for k in kinds)
    for alt in [k for k in ("upstream", "bare") if k in kinds]:
        rows.append(
            Row(
                SECTION,
                f"{label}: peak memory, ours vs {alt}",
                "MiB",
                [peak["ours"]],
                [peak[alt]],
                pair_ratios([peak["ours"]], [peak[alt]]),
                note=f"every arm under --memory {memory}; peak (cgroup) {peak}; in use at the "
                f"end (MiB): {in_use}",
                fmt="{:.0f}",
            )
        )
    rows.append(
        Row(
            SECTION,
            f"{label}: tcmalloc / Intel OpenMP mapped, ours vs upstream",
            "",
            [arm["ours"]["mapped"]],
            [arm["upstream"]["mapped"]],
            note=f"bare: {arm['bare']['mapped'] if 'bare' in arm else 'not run'}; "
            f"ours' plan: {plan_brief(arm['ours']['plan'])}",
        )
    )
    return rows


BOUND_GOAL = "ratio >= 0.70"
BOUND_LOADS = ("1 stream", "4 streams")


def bound_rows(label: str, got: dict) -> list[Row]:
    """Ours against the bandwidth bound (bound.py) at BOUND_LOADS, in the same run."""
    if "bandwidth" not in got:
        return []
    rows = []
    for load in [x for x in BOUND_LOADS if x in got["loads"]]:
        n = got["loads"][load][0]
        limit = bound.bound_tokens_per_s(n, got["bandwidth"], got["step_bytes"])
        ours = _values(got["got"][("ours", load)], "tok_s")
        rows.append(
            Row(
                SECTION,
                f"{label}, {load}: ours vs the bandwidth bound",
                "tokens/s",
                [v for v in ours if v is not None],
                [limit] * len(ours),
                pair_ratios(ours, [limit] * len(ours)),
                BOUND_GOAL,
                note=f"bound {n} x {got['bandwidth'] / 1e9:.1f} GB/s read / "
                f"{got['step_bytes'] / 1e9:.3f} GB of weights a step (bench/bound.py)",
                fmt="{:.1f}",
            )
        )
    return rows


def plan_brief(line: str) -> str:
    """The plan line's threads, runtime and LD_PRELOAD (the whole line is in the JSON)."""
    parts = re.findall(r"(?:threads|runtime): [^;]*|LD_PRELOAD=\S+", line)
    return "; ".join(parts) or line[:300]


def _remove_caches(root: pathlib.Path) -> None:
    """The run's compile caches; what uid 10001 wrote there and this user cannot remove is
    removed by a container of the image (as that user)."""
    shutil.rmtree(root, ignore_errors=True)
    if root.exists():
        sweep = ["--entrypoint", "sh", IMAGE, "-c", "rm -rf /c/* /c/.[!.]*"]
        docker("run", "--rm", "-v", f"{root}:/c", *sweep, check=False, timeout=300)
        shutil.rmtree(root, ignore_errors=True)
    if root.exists():
        log(f"runtime: could not remove {root}")
