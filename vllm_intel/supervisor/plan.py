"""The CPU plan: how vLLM's CPU backend fits the container, a pure function of typed inputs.

`plan(limits, work, env)` decides, once and before vLLM starts, the OpenMP threads and their
binding, whether the shared-memory queue readers wait instead of spinning, the KV cache size,
and the runtime libraries preloaded into vLLM (runtime.py finds them). It reads no file and
starts nothing; the entrypoint prints it (`entrypoint.py plan`) and applies it as environment
when it spawns vLLM.

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

Nothing pins vLLM: CPUs of its own are the orchestrator's to give (`--cpuset-cpus`, Kubernetes'
static CPU manager). A pin of the plan's own was measured and deleted
(docs/decisions/0002-delete-the-pin.md).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from .errors import ConfigError, parse_whole
from .limits import LIMIT_FLAGS, GiB, Limits, MiB, format_cpu_list
from .runtime import IOMP, TCMALLOC, TCMALLOC_PACKAGE, Libraries
from .workload import Workload

PLAN_MODES = ("0", "1")
# What each process of a `vllm serve` run holds (processes()), summed over every process, must fit
# memory.max: vLLM gives each worker its own VLLM_CPU_KVCACHE_SPACE and its share of the
# weights. Besides those, each process is Python with torch and vLLM imported; a worker also
# holds inductor's compiled kernels, activations and a part that grows with its weights (it did
# not stay constant from one model size to the next). The allowances must hold what was measured
# per process (docs/bench.md, "memory"); MEMORY_HEADROOM is for what a measurement did not see.
API_SERVER_BYTES = 640 * MiB
ENGINE_CORE_BYTES = 640 * MiB
WORKER_BYTES = 768 * MiB
RUNTIME_PER_WEIGHT_BYTE = 0.5  # of a worker's share of the weights
RUNTIME_BYTES = API_SERVER_BYTES + ENGINE_CORE_BYTES + WORKER_BYTES  # one of each, no weights
KV_DEFAULT_GIB = 1  # no memory limit: what the images always used (fits the built-in model)
MEMORY_HEADROOM = 0.10  # of memory.max, kept free for activation peaks and fragmentation
PLANNED = (
    "VLLM_CPU_OMP_THREADS_BIND",
    "OMP_NUM_THREADS",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_SHM_BROADCAST_BUSY_SLEEP_S",
    "LD_PRELOAD",
    "KMP_BLOCKTIME",
    "KMP_TPAUSE",
)
# Intel OpenMP's wait settings as vLLM sets them where it binds the threads itself
# (vllm/utils/ompmultiprocessing.py: a thread spins 5 ms after a parallel region, then sleeps;
# no TPAUSE low-power state). With `nobind` vLLM sets nothing, and the library's own default
# spin (200 ms) would bill a CPU quota between decode steps: the plan sets vLLM's values.
IOMP_WAITS = {"KMP_BLOCKTIME": "5", "KMP_TPAUSE": "0"}
# vLLM's shared-memory queue readers spin on sched_yield between messages (the shm-busy-sleep
# patch reads this variable). Under a quota the spin runs on another CPU beside the work and
# bills the quota. Without a CPU of its own it takes the CPU the API server needs: vLLM's
# `auto` binding gives the OpenMP threads one CPU per physical core but one per worker, and the
# engine core (whose reader spins while the worker computes) and the API server share what is
# left; with one CPU left, new connections wait and streams get their first bytes at the end
# (docs/bench.md, "stall"). The patch makes the readers block on the writer's wake-up instead.
# Not on a single CPU: there sched_yield hands the one CPU straight to the process with work, and
# a sleep only delays the reader (docs/bench.md, "limits", "Where a quota goes").
SPIN = "VLLM_SHM_BROADCAST_BUSY_SLEEP_S"
SPIN_SLEEP_S = "0.0001"
SPARE_CPUS = 2  # the API server's and the engine core's, beside the OpenMP threads


@dataclass(frozen=True)
class Plan:
    """What the entrypoint sets for vLLM. None / False: left to vLLM (or to you, `yours`)."""

    limits: Limits
    work: Workload
    device: str = "cpu"
    mode: str = "1"  # INTEL_VLLM_CPU_PLAN
    yours: dict[str, str] = field(default_factory=dict)  # your values, kept as they are
    omp_threads: int | None = None  # OMP_NUM_THREADS per worker
    binding: str | None = None  # VLLM_CPU_OMP_THREADS_BIND
    spare_cpus: int | None = None  # beside vLLM's auto OpenMP threads (None: not vLLM's auto)
    readers_wait: bool = False  # the shm queue readers block instead of spinning
    kv_gib: int | None = None  # VLLM_CPU_KVCACHE_SPACE
    rank_cpus: tuple[tuple[int, ...], ...] | None = None  # each worker's own CPUs (bind_ranks)
    libs: Libraries = Libraries()  # the runtime libraries found (runtime.find)
    preload: tuple[str, ...] = ()  # LD_PRELOAD for vLLM

    @property
    def enabled(self) -> bool:
        return self.mode != "0"

    @property
    def shm_needed(self) -> int:
        return self.work.shm_needed

    @property
    def env(self) -> dict[str, str]:
        """Set in vLLM's environment by the entrypoint."""
        env = {}
        if self.binding is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.binding
        if self.omp_threads is not None:
            env["OMP_NUM_THREADS"] = str(self.omp_threads)
        if self.readers_wait:
            env[SPIN] = SPIN_SLEEP_S
        if self.kv_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_gib)
        if self.preload:
            env["LD_PRELOAD"] = ":".join(self.preload)
            if self.libs.iomp in self.preload and self.binding == "nobind":
                env.update({k: v for k, v in IOMP_WAITS.items() if k not in self.yours})
        return env

    def runtime_text(self) -> str:
        if "LD_PRELOAD" in self.yours:
            return "yours (LD_PRELOAD)"
        malloc = "tcmalloc" if self.libs.tcmalloc in self.preload else "glibc malloc"
        omp = "Intel OpenMP" if self.libs.iomp in self.preload else "GNU OpenMP (torch's)"
        missing = []
        if self.libs.tcmalloc is None:
            missing.append(f"{TCMALLOC} not found (Debian/Ubuntu package {TCMALLOC_PACKAGE})")
        if self.libs.iomp is None:
            missing.append(f"{IOMP} not found (pip package intel-openmp)")
        return f"{malloc} + {omp}" + (f": {'; '.join(missing)}" if missing else "")

    def threads_text(self) -> str:
        lim, workers = self.limits, self.work.workers
        if "VLLM_CPU_OMP_THREADS_BIND" in self.yours or "OMP_NUM_THREADS" in self.yours:
            return "yours"
        if self.rank_cpus is not None:
            return (
                f"each of the {workers} workers bound to CPUs of its own ({self.binding}): vLLM's "
                f"auto binding needs a NUMA node per worker, {len(lim.nodes) or 1} allowed"
            )
        if self.spare_cpus is not None:
            return (
                f"vLLM auto over the {len(lim.cpus)} allowed CPUs (no quota below them), "
                f"{self.spare_cpus} beside its OpenMP threads"
            )
        if self.omp_threads is None:
            return "vLLM's"
        return (
            f"{self.omp_threads} OpenMP thread(s) per worker x {workers} worker(s), not pinned "
            f"(quota {lim.quota:g} CPUs of {len(lim.cpus)} allowed)"
        )

    def kv_text(self) -> str:
        each = per_worker(self.work)
        if "VLLM_CPU_KVCACHE_SPACE" in self.yours:
            return f"{self.yours['VLLM_CPU_KVCACHE_SPACE']} GiB{each} (yours)"
        if self.work.kv_flag is not None and self.enabled:
            return f"--kv-cache-memory-bytes {self.work.kv_flag}{each} (yours)"
        if self.kv_gib is None:
            return "vLLM's"
        mem = self.limits.memory
        if mem is None:
            return f"{self.kv_gib} GiB{each} (no memory limit)"
        return (
            f"{self.kv_gib} GiB{each} of memory.max {mem / GiB:.1f} GiB (after "
            f"{fixed_text(self.work)}, {MEMORY_HEADROOM:.0%} headroom)"
        )

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
            f"plan: {self.limits.describe()} -> threads: {self.threads_text()}; "
            f"runtime: {self.runtime_text()}; "
            f"KV cache: {self.kv_text()}; /dev/shm need {self.shm_needed / MiB:.0f} MiB; "
            f"env: {' '.join(parts) or 'nothing'}"
        )


@dataclass(frozen=True)
class Process:
    """`count` processes of one role, each holding `runtime + weights + kv` bytes."""

    role: str
    count: int
    runtime: int
    weights: int = 0
    kv: int = 0

    @property
    def each(self) -> int:
        return self.runtime + self.weights + self.kv


def processes(work: Workload, kv_gib: int) -> tuple[Process, ...]:
    """Every process vLLM starts for `work` with a KV cache of `kv_gib` GiB per worker."""
    share = math.ceil((work.weights or 0) / (work.tp * work.pp))  # TP x PP shard; DP copies
    return (
        Process("API server", work.api_servers, API_SERVER_BYTES),
        Process("engine core", work.dp, ENGINE_CORE_BYTES),
        Process(
            "worker",
            work.workers,
            WORKER_BYTES + math.ceil(share * RUNTIME_PER_WEIGHT_BYTE),
            share,
            kv_gib * GiB,
        ),
    )


def memory_needed(work: Workload, kv_gib: int) -> int:
    """What all of vLLM's processes and its /dev/shm queues hold, with `kv_gib` GiB per worker."""
    return sum(p.count * p.each for p in processes(work, kv_gib)) + work.shm_needed


def runtime_bytes(work: Workload) -> int:
    """The runtime allowance of all of `work`'s processes: all but weights, KV cache and shm."""
    return sum(p.count * p.runtime for p in processes(work, 0))


def fixed_bytes(work: Workload) -> int:
    """Memory vLLM takes besides the KV cache."""
    return memory_needed(work, 0)


def least_memory(work: Workload, kv_gib: int = 1) -> int:
    """The smallest memory limit (bytes, whole MiB) under which the plan gives `work` a KV cache
    of `kv_gib` GiB per worker: the plan's edge."""
    need = memory_needed(work, kv_gib) / (1 - MEMORY_HEADROOM)
    return math.ceil(need / MiB) * MiB


def fixed_text(work: Workload) -> str:
    counted = "" if work.weights is not None else " (not a local dir: not counted)"
    copies = f" x {work.dp} data-parallel copies" if work.dp > 1 and work.weights else ""
    who = ", ".join(f"{p.count} {p.role}{'s' if p.count > 1 else ''}" for p in processes(work, 0))
    return (
        f"weights {(work.weights or 0) / GiB:.1f} GiB{counted}{copies}"
        f" + runtime {runtime_bytes(work) / GiB:.1f} GiB ({who})"
        f" + /dev/shm {work.shm_needed / MiB:.0f} MiB"
    )


def per_worker(work: Workload) -> str:
    """ " per worker x N workers" where vLLM runs several (each allocates its own KV cache)."""
    return f" per worker x {work.workers} workers" if work.workers > 1 else ""


def plan(
    limits: Limits,
    work: Workload,
    env: dict[str, str],
    device: str = "cpu",
    libs: Libraries = Libraries(),
) -> Plan:
    """The plan for `work` in `limits`, with the runtime libraries `libs`. Raises ConfigError when the container cannot hold what
    vLLM needs (memory, CPUs for its workers) or a value is not one the plan can take."""
    mode = env.get("INTEL_VLLM_CPU_PLAN") or "1"
    if mode not in PLAN_MODES:
        raise ConfigError(
            f"INTEL_VLLM_CPU_PLAN must be one of {', '.join(PLAN_MODES)}, not {mode!r}"
        )
    if device != "cpu":
        return Plan(limits, work, device, mode)
    yours = {k: env[k] for k in PLANNED if env.get(k)}
    if SPIN in yours:
        from vllm_intel.patches import busy_sleep_s

        try:
            busy_sleep_s(env)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    p = Plan(limits, work, device, mode, yours, **_threads(limits, work, mode, yours), libs=libs)
    if mode != "0" and "LD_PRELOAD" not in yours:
        p = replace(p, preload=libs.preload)
    p = replace(p, readers_wait=_readers_wait(p))
    return replace(p, kv_gib=_kv_gib(limits, work, mode, yours))


def _threads(limits: Limits, work: Workload, mode: str, yours: dict) -> dict:
    """The OpenMP threads and their binding, as Plan fields."""
    quota, allowed, workers = limits.quota, limits.cpus, work.workers
    if "VLLM_CPU_OMP_THREADS_BIND" in yours or "OMP_NUM_THREADS" in yours:
        return {}
    if quota is None or quota >= len(allowed):
        if workers > 1 and len(limits.nodes) < workers:  # no nodes read: one node, as vLLM sees
            return {} if mode == "0" else bind_ranks(limits, workers)
        return {"spare_cpus": len(allowed) - max(limits.cores - workers, workers)}
    if mode == "0":
        return {}
    # floor: threads that need more CPU than the quota grants get throttled in turn; at least one
    # per worker, which is what vLLM needs to start at all. Not vLLM's binding: a quota below the
    # allowed CPUs means CPUs shared with other containers, and every container binding its
    # threads the same way (vLLM's `auto` does: the first cores of the node) would pile them all
    # onto the same CPUs while the others idle.
    count = max(workers, math.floor(quota))
    if count > len(allowed):
        raise ConfigError(
            f"{workers} vLLM CPU workers (DP x TP x PP) need {workers} CPUs, the container "
            f"allows {len(allowed)}: give it more CPUs or lower --tensor-parallel-size"
        )
    return {"omp_threads": count // workers, "binding": "nobind"}


def bind_ranks(limits: Limits, workers: int) -> dict:
    """VLLM_CPU_OMP_THREADS_BIND as CPU lists, one per worker (`0-3|4-7`), where vLLM's `auto`
    cannot bind: it gives each worker a NUMA node of its own and asserts "Not enough allowed NUMA
    nodes to bind threads of N local CPUWorkers" with fewer (vllm/utils/ompmultiprocessing.py).
    Disjoint lists of equal size, node by node; the CPUs left over stay for the API server and
    the engine core."""
    allowed = limits.cpus
    if len(allowed) < workers:
        raise ConfigError(
            f"{workers} vLLM CPU workers (DP x TP x PP) need {workers} CPUs, the container "
            f"allows {len(allowed)}: give it more CPUs or lower --tensor-parallel-size"
        )
    node_of = {c: n for n, cpus in limits.nodes.items() for c in cpus}
    order = sorted(allowed, key=lambda c: (node_of.get(c, 0), c))
    per = len(order) // workers
    ranks = tuple(tuple(order[i * per : (i + 1) * per]) for i in range(workers))
    return {"binding": "|".join(format_cpu_list(r) for r in ranks), "rank_cpus": ranks}


def _readers_wait(p: Plan) -> bool:
    """Whether the shm queue readers should block on the writer's wake-up instead of spinning."""
    quota, allowed = p.limits.quota, p.limits.cpus
    under_quota = quota is not None and quota < len(allowed)
    spare = p.spare_cpus
    if p.rank_cpus is not None:
        spare = len(allowed) - sum(len(r) for r in p.rank_cpus)
    no_spare = spare is not None and spare < SPARE_CPUS and len(allowed) > 1
    return p.enabled and SPIN not in p.yours and (under_quota or no_spare)


def _kv_gib(limits: Limits, work: Workload, mode: str, yours: dict) -> int | None:
    """VLLM_CPU_KVCACHE_SPACE to set (GiB per worker, an integer: vLLM reads int() of it), or
    None; checks your own value (the variable, else --kv-cache-memory-bytes, which the variable
    would override in vLLM) against the memory limit."""
    mem = limits.memory
    if "VLLM_CPU_KVCACHE_SPACE" in yours:
        value = parse_whole(
            "VLLM_CPU_KVCACHE_SPACE", yours["VLLM_CPU_KVCACHE_SPACE"], what="whole GiB"
        )
        _check_yours(work, mem, value * GiB, f"VLLM_CPU_KVCACHE_SPACE={value} GiB")
        _check_context(
            work, value, f"(VLLM_CPU_KVCACHE_SPACE={value})", "set VLLM_CPU_KVCACHE_SPACE={need}"
        )
        return None
    if work.kv_flag is not None:  # the context: context.py leaves it to vLLM
        flag = kv_flag_bytes(work.kv_flag)
        if flag is not None:
            _check_yours(work, mem, flag, f"--kv-cache-memory-bytes {work.kv_flag}")
        return None
    if mode == "0":
        return None
    if mem is None:
        _check_context(
            work, KV_DEFAULT_GIB, "(no memory limit)", "set VLLM_CPU_KVCACHE_SPACE={need}"
        )
        return KV_DEFAULT_GIB
    kv = math.floor((mem * (1 - MEMORY_HEADROOM) - fixed_bytes(work)) / (work.workers * GiB))
    ctx = work.context
    if kv < 1:
        need = max(1, ctx.kv_gib_needed() if ctx is not None else 1)  # then one request fits
        why = f" (a {need} GiB KV cache{per_worker(work)}: the model's context)" if need > 1 else ""
        raise ConfigError(
            f"memory.max {mem / GiB:.1f} GiB cannot hold a 1 GiB KV cache{per_worker(work)} + "
            f"{fixed_text(work)} + {MEMORY_HEADROOM:.0%} headroom: raise the memory limit "
            f"{LIMIT_FLAGS} to at least {math.ceil(least_memory(work, need) / GiB)} GiB{why}"
            + fewer_workers(work, mem)
        )
    if ctx is not None:
        least = math.ceil(least_memory(work, ctx.kv_gib_needed()) / GiB)
        _check_context(
            work, kv, f"(from memory.max {mem / GiB:.1f} GiB)",
            f"raise the memory limit {LIMIT_FLAGS} to at least {least} GiB (a {{need}} GiB KV "
            "cache)",
        )  # fmt: skip
    return kv


def fewer_workers(work: Workload, mem: int) -> str:
    """ "; or ..." naming one worker where it fits `mem` and vLLM runs several, else ""."""
    if work.workers == 1 or work.context is not None:  # the context's share is per worker
        return ""
    one = replace(work, tp=1, pp=1, dp=1, api_servers=1, shm_needed=work.shm_needed // work.dp)
    if least_memory(one) > mem:
        return ""
    return (
        "; or run one worker (no --tensor-parallel-size, --pipeline-parallel-size or "
        "--data-parallel-size), which fits this limit"
    )


def _check_yours(work: Workload, mem: int | None, kv_bytes: int, yours: str) -> None:
    """Your KV cache size, which every worker allocates, against the memory limit."""
    need = memory_needed(work, 0) + work.workers * kv_bytes
    if mem is not None and need > mem:
        raise ConfigError(
            f"{yours}{per_worker(work)} + {fixed_text(work)} do not fit memory.max "
            f"{mem / GiB:.1f} GiB: lower it or raise the memory limit {LIMIT_FLAGS} to at "
            f"least {math.ceil(need / GiB)} GiB"
        )


HUMAN_BYTES = re.compile(r"\s*([0-9]{1,15}(?:\.[0-9]{1,9})?)([kKmMgGtT]?)\s*", re.ASCII)
MULTIPLIERS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
MULTIPLIERS.update({"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40})


def kv_flag_bytes(value: str) -> int | None:
    """--kv-cache-memory-bytes as vLLM's human_readable_int reads it (`4G`, `1.5g`, `1073741824`);
    None for what it would refuse itself (vLLM says so at start)."""
    m = HUMAN_BYTES.fullmatch(value)
    if m is None or ("." in m.group(1) and not m.group(2)):
        return None
    return int(float(m.group(1)) * MULTIPLIERS[m.group(2)])


def _check_context(work: Workload, kv_gib: int, whose: str, fix: str) -> None:
    """vLLM's refusal to start when its KV cache cannot hold one request of the model's whole
    context, said before anything starts (context.py: only where vLLM surely refuses)."""
    ctx = work.context
    if ctx is None or ctx.needed <= kv_gib * GiB:
        return
    fits = ctx.fitting(kv_gib * GiB)
    shorter = f"pass --max-model-len {fits} or less, or " if fits else ""
    raise ConfigError(
        f"the model's {ctx.tokens}-token context ({ctx.source}) needs a {ctx.needed / GiB:.1f} GiB "
        f"KV cache for one request ({ctx.shape()}); the KV cache is {kv_gib} GiB {whose}: "
        f"{shorter}{fix.format(need=ctx.kv_gib_needed())}"
    )
