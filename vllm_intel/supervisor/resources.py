"""What the container gives vLLM (CPUs, CPU quota, memory limit, NUMA nodes, /dev/shm) and the
plan that fits vLLM's CPU backend into it: OpenMP threads, the shared-memory queue readers' wait,
the KV cache size, and the preflight checks that fail in one line before anything starts.

Read-only and cheap (a few small files under /sys, no vLLM import): `entrypoint.py plan` and
`entrypoint.py serve` both use it. The roots (/sys/fs/cgroup, /sys/devices/system) are parameters
so that tests can hand it fake trees.

Why a plan at all: vLLM's CPU worker sizes its OpenMP threads from the affinity mask
(vllm/utils/ompmultiprocessing.py, `VLLM_CPU_OMP_THREADS_BIND=auto`: one logical CPU per physical
core of the allowed set, minus one reserved CPU per worker for the engine core), never from the CFS
quota (`docker --cpus`, Kubernetes limits.cpu). Under a quota smaller than the affinity set, it
runs more threads than the quota can keep running, and they get throttled in turn; floor(quota)
threads fit. They are not pinned: that affinity set is shared with other containers, and pinning
them all the same way (as `auto` does) piles them onto the same cores. Its shared-memory queue
readers spin on sched_yield between messages, which on CPUs beyond the quota burns the quota
itself, and without a spare CPU starves the API server: under a quota, or with fewer than two
CPUs beside the OpenMP threads (on more than one CPU), they block until the writer wakes them
instead (VLLM_SHM_BROADCAST_BUSY_SLEEP_S, the shm-busy-sleep patch). And its KV cache is either a
fixed `VLLM_CPU_KVCACHE_SPACE` or a fraction of host memory; neither looks at memory.max.

Under a quota the processes still run on every allowed CPU, and each token's round trip (API
server -> engine core -> worker and back) wakes a process on another CPU: more CPU per token than
the same processes on one CPU, and more throttled CFS periods (docs/bench.md, "limits"). With
`INTEL_VLLM_CPU_PLAN=pin` (opt-in) the plan confines every vLLM process to ceil(quota) CPUs, the
idlest at start, one per physical core first, and the supervisor moves the pin off CPUs that others
load later (pinning.py). It is not the default (`1`, the same plan unpinned): a container cannot
know who else is confined to the same CPUs, and nothing in PID 1 changes vLLM's placement while
it runs unless asked.
"""

from __future__ import annotations

import math
import os
import pathlib
import shutil
import stat
import time
from dataclasses import dataclass, field

from .settings import ConfigError, shown

MiB = 1 << 20
GiB = 1 << 30
CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")
SYS_ROOT = pathlib.Path("/sys/devices/system")
PROC_STAT = pathlib.Path("/proc/stat")
PLAN_MODES = ("0", "1", "pin")
V1_UNLIMITED = 1 << 62  # cgroup v1 reports "no limit" as a value near PAGE_COUNTER_MAX

# Memory the vLLM processes take besides weights, KV cache and /dev/shm: three Python processes
# with torch (API server, engine core, worker), inductor's compiled kernels, activations.
# An estimate, not yet measured: the CPU image serves the built-in model under --memory 4g
# (tests/container/test_limits.py) with it, which is all that is checked.
RUNTIME_BYTES = 2 * GiB
KV_DEFAULT_GIB = 1  # no memory limit: what the images always used (fits the built-in model)
MEMORY_HEADROOM = 0.10  # of memory.max, kept free for activation peaks and fragmentation

# vLLM's shared memory (vllm/distributed/device_communicators/shm_broadcast.py,
# vllm/v1/executor/multiproc_executor.py, identical in 0.27.1 and 0.32.0): the executor's
# broadcast MessageQueue (VLLM_MQ_MAX_CHUNK_BYTES_MB chunks x 10) and one response MessageQueue
# per worker (24 MiB chunks x 10), each a ShmRingBuffer of (chunk + 1 + readers) x chunks bytes;
# with --enable-shm-tensor-arena an arena of 8 x 256 MiB slots; with TP/PP > 1 a broadcaster of
# 6 x 4 MiB chunks per group. vLLM's check_shm_free_space() checks each segment alone when it is
# created, but every chunk of a ring buffer is written as messages go round, so all of them end up
# resident: too small a /dev/shm then fails later, with SIGBUS.
MQ_CHUNKS = 10
MQ_RESPONSE_CHUNK = 24 * MiB
ARENA_SLOTS, ARENA_SLOT = 8, 256 * MiB
GROUP_MQ_CHUNKS, GROUP_MQ_CHUNK = 6, 4 * MiB


def ring_buffer_bytes(chunk: int, chunks: int, readers: int) -> int:
    """ShmRingBuffer.total_bytes_of_buffer: (max_chunk_bytes + 1 + n_reader) * max_chunks."""
    return (chunk + 1 + readers) * chunks


def parse_cpu_list(text: str) -> list[int]:
    """'0-2,4' -> [0, 1, 2, 4] (the kernel's cpulist format)."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return sorted(out)


def format_cpu_list(cpus) -> str:
    """[0, 1, 2, 4] -> '0-2,4'."""
    cpus, runs = sorted(cpus), []
    for c in cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def _read(path: pathlib.Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text not in (None, "", "max") else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Limits:
    """What this process may use. quota: CPUs (cpu.max / cfs_quota) or None; memory: bytes or
    None; cpus: the affinity mask within the cpuset; nodes: NUMA node -> its allowed CPUs;
    cores: how many physical cores those CPUs are (SMT siblings once; a CPU without topology
    files counts as a core); core_of: each CPU's core (package, core id)."""

    cgroup: str  # "v2", "v1" or "none"
    cpus: tuple[int, ...]
    quota: float | None
    memory: int | None
    cores: int
    nodes: dict[int, tuple[int, ...]] = field(default_factory=dict)
    core_of: dict[int, object] = field(default_factory=dict)

    def describe(self) -> str:
        quota = "no CPU quota" if self.quota is None else f"quota {self.quota:g} CPUs"
        mem = (
            "no memory limit" if self.memory is None else f"memory.max {self.memory / GiB:.1f} GiB"
        )
        return (
            f"cgroup {self.cgroup}: CPUs {format_cpu_list(self.cpus)} ({len(self.cpus)}), "
            f"{quota}, {mem}, {len(self.nodes) or 1} NUMA node(s)"
        )


def _own_paths(self_cgroup: str) -> dict[str, str]:
    """controller -> this process's cgroup path, from /proc/self/cgroup ('' key = v2)."""
    paths = {}
    for line in self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctrl in parts[1].split(",") if parts[1] else [""]:
                paths[ctrl] = parts[2].strip()
    return paths


def _walk(base: pathlib.Path, own: str) -> list[pathlib.Path]:
    """This process's cgroup directory and its ancestors up to the mount (a limit anywhere above
    applies too). In a container with its own cgroup namespace, or with its cgroup mounted at the
    root (Docker on v1), the path does not exist below the mount: then only the mount itself."""
    dirs, path = [], base / own.lstrip("/") if own else base
    while True:
        if path.is_dir():
            dirs.append(path)
        if path == base or base not in path.parents:
            break
        path = path.parent
    return dirs or [base]


def _min(values) -> int | float | None:
    found = [v for v in values if v is not None]
    return min(found) if found else None


def read_limits(
    cgroup_root: pathlib.Path = CGROUP_ROOT,
    sys_root: pathlib.Path = SYS_ROOT,
    affinity: set[int] | None = None,
    self_cgroup: str | None = None,
) -> Limits:
    if affinity is None:
        affinity = set(os.sched_getaffinity(0))
    if self_cgroup is None:
        self_cgroup = _read(pathlib.Path("/proc/self/cgroup")) or ""
    own = _own_paths(self_cgroup)
    cpus, quota, memory = set(affinity), None, None
    if (cgroup_root / "cgroup.controllers").exists():
        kind = "v2"
        dirs = _walk(cgroup_root, own.get("", ""))

        def v2_quota(d):
            parts = (_read(d / "cpu.max") or "max").split()
            q, period = _int(parts[0]), _int(parts[1]) if len(parts) > 1 else 100000
            return q / period if q and period else None

        quota = _min(v2_quota(d) for d in dirs)
        memory = _min(_int(_read(d / "memory.max")) for d in dirs)
        cpuset = _read(dirs[0] / "cpuset.cpus.effective")
        if cpuset:
            cpus &= set(parse_cpu_list(cpuset))
    elif any((cgroup_root / c).is_dir() for c in ("cpu", "cpu,cpuacct", "memory")):
        kind = "v1"
        cpu_dir = next(
            (cgroup_root / c for c in ("cpu", "cpu,cpuacct") if (cgroup_root / c).is_dir()), None
        )
        if cpu_dir is not None:

            def v1_quota(d):
                q = _int(_read(d / "cpu.cfs_quota_us"))
                period = _int(_read(d / "cpu.cfs_period_us"))
                return q / period if q and q > 0 and period else None

            quota = _min(v1_quota(d) for d in _walk(cpu_dir, own.get("cpu", "")))
        mem_dir = cgroup_root / "memory"
        if mem_dir.is_dir():
            values = (
                _int(_read(d / "memory.limit_in_bytes"))
                for d in _walk(mem_dir, own.get("memory", ""))
            )
            memory = _min(v for v in values if v is not None and v < V1_UNLIMITED)
        cpuset = _read(
            _walk(cgroup_root / "cpuset", own.get("cpuset", ""))[0] / "cpuset.effective_cpus"
        )
        if cpuset:
            cpus &= set(parse_cpu_list(cpuset))
    else:
        kind = "none"
    cpus = cpus or set(affinity)
    nodes = {}
    for node_dir in sorted((sys_root / "node").glob("node[0-9]*")):
        listed = _read(node_dir / "cpulist")
        if listed is not None:
            mine = tuple(c for c in parse_cpu_list(listed) if c in cpus)
            if mine:
                nodes[int(node_dir.name[4:])] = mine
    core_of = {}
    for cpu in cpus:
        topo = sys_root / "cpu" / f"cpu{cpu}" / "topology"
        core = _read(topo / "core_id")
        core_of[cpu] = (_read(topo / "physical_package_id"), core) if core is not None else cpu
    cores = len(set(core_of.values()))
    return Limits(kind, tuple(sorted(cpus)), quota, memory, cores, nodes, core_of)


# ------------------------------------------------------------------------------------- plan

PLANNED = (
    "VLLM_CPU_OMP_THREADS_BIND",
    "OMP_NUM_THREADS",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_SHM_BROADCAST_BUSY_SLEEP_S",
)
# vLLM's shared-memory queue readers spin on sched_yield between messages (the shm-busy-sleep
# patch reads this variable). Under a quota the spin runs on another CPU beside the work and
# bills the quota. Without a CPU of its own it takes the CPU the API server needs: vLLM's
# `auto` binding gives the OpenMP threads one CPU per physical core but one per worker, and the
# engine core (whose reader spins while the worker computes) and the API server share what is
# left; with one CPU left, new connections waited 5-23 s and streams got their first bytes at
# the end on 2 cores (bench/stall.py). The patch makes the readers block on the writer's wake-up
# instead. Not on a single CPU: there sched_yield hands the one CPU straight to the process with
# work (a 100 us sleep there cost a one-CPU cpuset 1400 / 1500 tokens/s of 2070, bench limits).
SPIN = "VLLM_SHM_BROADCAST_BUSY_SLEEP_S"
SPIN_SLEEP_S = "0.0001"
SPARE_CPUS = 2  # the API server's and the engine core's, beside the OpenMP threads


def parallel(flags: list[str]) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes of `vllm serve FLAGS`, from the command line or its
    --config file as vLLM resolves them (vllm_args)."""
    from .vllm_args import resolve

    found = resolve(flags)
    sizes = []
    for name, value in (
        ("--tensor-parallel-size", found.tensor_parallel_size),
        ("--pipeline-parallel-size", found.pipeline_parallel_size),
    ):
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be a whole number >= 1, not {shown(value)}")
        sizes.append(value or 1)
    return sizes[0], sizes[1]  # their product is bounded by vllm_args.resolve (MAX_PARALLEL)


def shm_segments(flags: list[str], env=os.environ) -> list[tuple[str, int]]:
    """The shared memory segments vLLM creates for `vllm serve FLAGS` on one node (see above)."""
    return _segments(flags, *parallel(flags), env)


def _segments(flags: list[str], tp: int, pp: int, env) -> list[tuple[str, int]]:
    workers = tp * pp
    chunk_mb = env.get("VLLM_MQ_MAX_CHUNK_BYTES_MB", "16")
    if not chunk_mb.strip().isdigit():
        raise ConfigError(
            f"VLLM_MQ_MAX_CHUNK_BYTES_MB must be a whole number, not {shown(chunk_mb)}"
        )
    segs = [
        ("executor broadcast queue", ring_buffer_bytes(int(chunk_mb) * MiB, MQ_CHUNKS, workers))
    ]
    segs += [
        ("worker response queue", ring_buffer_bytes(MQ_RESPONSE_CHUNK, MQ_CHUNKS, 1))
    ] * workers
    if workers > 1:
        groups = (tp > 1) + (pp > 1)
        segs += [
            ("TP/PP group broadcaster", ring_buffer_bytes(GROUP_MQ_CHUNK, GROUP_MQ_CHUNKS, workers))
        ] * (groups * workers)
    if "--enable-shm-tensor-arena" in flags:
        segs.append(("tensor arena", ring_buffer_bytes(ARENA_SLOT, ARENA_SLOTS, workers)))
    return segs


MAX_MODEL_ENTRIES = 100_000  # a model directory holds tens of files; `/` holds millions


def weights_bytes(model: str | None) -> int | None:
    """Size of a local model's weight files; None when the model is not a local directory.
    Raises ConfigError for a directory it cannot read through, or one too big to be a model."""
    from .settings import path_exists, shown, user_path

    if not model:
        return None
    path = user_path("model path", model)
    if not path_exists("model path", path) or not path.is_dir():
        return None
    exts = (".safetensors", ".bin", ".pt", ".pth", ".gguf")

    def unreadable(e: OSError) -> None:
        raise ConfigError(
            f"model path {shown(model, 200, quote=False)}: cannot read {shown(str(e.filename or ''), 200, quote=False)}: "
            f"{e.strerror or e}"
        )

    total = entries = 0
    for top, dirs, files in os.walk(path, onerror=unreadable):  # symlinked dirs not followed
        entries += len(dirs) + len(files)
        if entries > MAX_MODEL_ENTRIES:
            raise ConfigError(
                f"model path {shown(model, 200, quote=False)} holds more than {MAX_MODEL_ENTRIES} files "
                "and directories: not a model directory"
            )
        for name in files:
            if not name.endswith(exts):
                continue
            try:
                st = os.stat(os.path.join(top, name))
            except FileNotFoundError:  # a dangling link: vLLM would not load it either
                continue
            except OSError as e:
                unreadable(e)
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


@dataclass
class Plan:
    limits: Limits
    device: str
    env: dict[str, str]  # set in vLLM's environment by the entrypoint
    yours: dict[str, str]  # the user's values, kept as they are
    threads: str  # how the OpenMP threads are decided, for the log line
    kv: str  # how the KV cache is sized, for the log line
    shm_needed: int
    enabled: bool = True
    pin: list[int] | None = None  # CPUs vLLM's processes are confined to (INTEL_VLLM_CPU_PLAN=pin)

    def line(self) -> str:
        if not self.enabled:
            return (
                f"plan: off (INTEL_VLLM_CPU_PLAN=0), vLLM's own defaults; {self.limits.describe()}"
            )
        if self.device != "cpu":
            return f"plan: {self.device}: no CPU plan; {self.limits.describe()}"
        parts = [f"{k}={v}" for k, v in self.env.items()]
        parts += [f"{k}={v} (yours)" for k, v in self.yours.items()]
        return (
            f"plan: {self.limits.describe()} -> threads: {self.threads}; KV cache: {self.kv}; "
            f"/dev/shm need {self.shm_needed / MiB:.0f} MiB; env: {' '.join(parts) or 'nothing'}"
        )


def cpu_ticks(cpus, stat: pathlib.Path = PROC_STAT) -> dict[int, tuple[int, int]]:
    """(idle + iowait, total) ticks so far of each CPU in `cpus` (/proc/stat, the host's CPUs).
    Not psutil.cpu_times(percpu=True): its list has no CPU numbers, and with a CPU offline its
    positions are not the numbers that affinity masks use."""
    out = {}
    for line in (_read(stat) or "").splitlines():
        name, *fields = line.split() or [""]
        if name[3:].isdigit() and name.startswith("cpu") and int(name[3:]) in cpus:
            # user nice system idle iowait irq softirq steal (guest time is inside user)
            ticks = [int(f) for f in fields[:8]]
            out[int(name[3:])] = (ticks[3] + ticks[4], sum(ticks))
    return out


def cpu_idle(cpus, sample_s: float = 0.2, stat: pathlib.Path = PROC_STAT) -> dict[int, int]:
    """Idle + iowait ticks of each CPU in `cpus` over `sample_s`."""
    before = cpu_ticks(cpus, stat)
    time.sleep(sample_s)
    after = cpu_ticks(cpus, stat)
    return {cpu: after[cpu][0] - before.get(cpu, (0, 0))[0] for cpu in after}


def one_per_core(ranked, n: int, core_of: dict | None = None) -> list[int]:
    """The first n of `ranked` (best first), taking one CPU of each physical core before any SMT
    sibling: two siblings share one core's execution units."""
    core_of = core_of or {}
    firsts, siblings, seen = [], [], set()
    for cpu in ranked:
        core = core_of.get(cpu, cpu)
        (siblings if core in seen else firsts).append(cpu)
        seen.add(core)
    return sorted((firsts + siblings)[:n])


def least_busy(cpus, n: int, idle: dict[int, int], core_of: dict | None = None) -> list[int]:
    """The n CPUs of `cpus` idle longest, one per core first; on a tie the higher numbers (vLLM's
    `auto` binding and many host services start at CPU 0)."""
    ranked = sorted(cpus, key=lambda c: (idle.get(c, 0), c), reverse=True)
    return one_per_core(ranked, n, core_of)


def plan(
    flags: list[str],
    model: str | None,
    limits: Limits,
    device: str = "cpu",
    env=os.environ,
    idle=cpu_idle,
) -> Plan:
    """The plan for `vllm serve [MODEL] FLAGS` in `limits`. Raises ConfigError when the
    container cannot hold what vLLM needs (memory). `idle(cpus)`: each CPU's idle time, asked
    only when the plan pins (INTEL_VLLM_CPU_PLAN=pin, opt-in, under a CPU quota)."""
    tp, pp = parallel(flags)  # resolved once: it may read a --config file
    workers = tp * pp
    shm_needed = sum(size for _, size in _segments(flags, tp, pp, env))
    explicit = bool(env.get("INTEL_VLLM_CPU_PLAN"))
    mode = env.get("INTEL_VLLM_CPU_PLAN") or "1"
    if mode not in PLAN_MODES:
        raise ConfigError(
            f"INTEL_VLLM_CPU_PLAN must be one of {', '.join(PLAN_MODES)}, not {mode!r}"
        )
    enabled = mode != "0"
    p = Plan(limits, device, {}, {}, "vLLM's", "vLLM's", shm_needed, enabled)
    if device != "cpu":
        return p
    yours = {k: env[k] for k in PLANNED if env.get(k)}
    p.yours = yours
    if SPIN in yours:
        from vllm_intel.patches.shm_busy_sleep import busy_sleep_s

        try:
            busy_sleep_s(env)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    # -- threads
    quota, allowed = limits.quota, limits.cpus
    under_quota = quota is not None and quota < len(allowed)
    spare = None  # CPUs beside vLLM's auto OpenMP threads (None: the threads are not vLLM's auto)
    if "VLLM_CPU_OMP_THREADS_BIND" in yours or "OMP_NUM_THREADS" in yours:
        if mode == "pin" and explicit:
            raise ConfigError(
                "INTEL_VLLM_CPU_PLAN=pin chooses the CPUs and the OpenMP threads: unset "
                f"{' and '.join(k for k in ('VLLM_CPU_OMP_THREADS_BIND', 'OMP_NUM_THREADS') if k in yours)}"
                " or set INTEL_VLLM_CPU_PLAN=1"
            )
        p.threads = "yours"
    elif not under_quota:
        omp = max(limits.cores - workers, workers)
        spare = len(allowed) - omp
        p.threads = (
            f"vLLM auto over the {len(allowed)} allowed CPUs (no quota below them), "
            f"{spare} beside its OpenMP threads"
            + ("; nothing to pin" if mode == "pin" and explicit else "")
        )
    elif enabled:
        # floor: threads that need more CPU than the quota grants get throttled in turn; at
        # least one per worker, which is what vLLM needs to start at all. Not vLLM's binding: a
        # quota below the allowed CPUs means CPUs shared with other containers, and every
        # container binding its threads the same way (vLLM's `auto` does: the first cores of the
        # node) would pile them all onto the same CPUs while the others idle. The pin instead
        # takes the idlest CPUs and moves off them when others load them (pinning.py).
        count = max(workers, math.floor(quota))
        if count > len(allowed):
            raise ConfigError(
                f"{workers} vLLM CPU workers (TP x PP) need {workers} CPUs, the container "
                f"allows {len(allowed)}: give it more CPUs or lower --tensor-parallel-size"
            )
        per = count // workers
        p.env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        p.env["OMP_NUM_THREADS"] = str(per)
        where = "not pinned"
        if mode == "pin":
            # every process, not only the OpenMP threads: the round trip is what crosses CPUs
            p.pin = least_busy(allowed, max(count, math.ceil(quota)), idle(allowed), limits.core_of)
            where = (
                f"all vLLM processes pinned to CPU {format_cpu_list(p.pin)} (idlest at start, "
                "moved when others load them)"
            )
        p.threads = (
            f"{per} OpenMP thread(s) per worker x {workers} worker(s), {where} "
            f"(quota {quota:g} CPUs of {len(allowed)} allowed)"
        )
    # Pinned to one CPU under a quota of one CPU the processes cannot use more than the quota,
    # and, as on a one-CPU cpuset, the spin's sched_yield() hands that CPU straight to the work:
    # there the futex wake-up served 0.96 / 0.91 of vLLM's spin at 1 / 8 streams (20 rounds,
    # intervals reaching 1.03 / 1.05; docs/bench.md, limits): nothing to gain from it.
    one_cpu = len(p.pin or ()) == 1 and quota is not None and quota >= 1
    if (
        enabled
        and SPIN not in yours
        and not one_cpu
        and (under_quota or (spare is not None and spare < SPARE_CPUS and len(allowed) > 1))
    ):
        p.env[SPIN] = SPIN_SLEEP_S

    # -- KV cache (GiB, an integer: vLLM reads int(VLLM_CPU_KVCACHE_SPACE))
    weights = weights_bytes(model)
    fixed = (weights or 0) + RUNTIME_BYTES + shm_needed
    need = (
        f"weights {(weights or 0) / GiB:.1f} GiB{'' if weights is not None else ' (not a local dir: not counted)'}"
        f" + runtime {RUNTIME_BYTES / GiB:.0f} GiB + /dev/shm {shm_needed / MiB:.0f} MiB"
    )
    mem = limits.memory
    if "VLLM_CPU_KVCACHE_SPACE" in yours:
        value = yours["VLLM_CPU_KVCACHE_SPACE"]
        if not value.strip().isdigit():
            raise ConfigError(f"VLLM_CPU_KVCACHE_SPACE must be whole GiB, not {shown(value)}")
        p.kv = f"{value} GiB (yours)"
        if mem is not None and int(value) * GiB + fixed > mem:
            raise ConfigError(
                f"VLLM_CPU_KVCACHE_SPACE={value} GiB + {need} do not fit memory.max "
                f"{mem / GiB:.1f} GiB: lower VLLM_CPU_KVCACHE_SPACE or raise the memory limit "
                f"(docker run --memory, compose mem_limit, k8s limits.memory) to at least "
                f"{math.ceil((int(value) * GiB + fixed) / GiB)} GiB"
            )
    elif enabled:
        if mem is None:
            kv = KV_DEFAULT_GIB
            p.kv = f"{kv} GiB (no memory limit)"
        else:
            kv = math.floor((mem * (1 - MEMORY_HEADROOM) - fixed) / GiB)
            if kv < 1:
                least = math.ceil((fixed + GiB) / (1 - MEMORY_HEADROOM) / GiB)
                raise ConfigError(
                    f"memory.max {mem / GiB:.1f} GiB cannot hold a 1 GiB KV cache + {need} "
                    f"+ {MEMORY_HEADROOM:.0%} headroom: raise the memory limit (docker run "
                    f"--memory, compose mem_limit, k8s limits.memory) to at least {least} GiB"
                )
            p.kv = f"{kv} GiB of memory.max {mem / GiB:.1f} GiB (after {need}, {MEMORY_HEADROOM:.0%} headroom)"
        p.env["VLLM_CPU_KVCACHE_SPACE"] = str(kv)
    return p


def check_shm(shm_dir: pathlib.Path, needed: int) -> None:
    """Preflight: the one-line version of vLLM's check_shm_free_space() (shm_broadcast.py),
    for all of vLLM's segments at once and before anything starts."""
    if not shm_dir.is_dir():
        return  # as vLLM: no /dev/shm, no check
    free = shutil.disk_usage(shm_dir).free
    if needed > free:
        size = max(1, math.ceil(2 * needed / GiB))
        raise ConfigError(
            f"{shm_dir} has {free / MiB:.0f} MiB free, vLLM needs {needed / MiB:.0f} MiB for its "
            f"message queues: run with docker run --shm-size={size}g (compose: shm_size: {size}g; "
            f"Kubernetes: an emptyDir with medium: Memory mounted at /dev/shm)"
        )
