"""The CPU plan over its whole input space (hypothesis): CPUs, quota, memory, NUMA nodes, SMT, tensor,
pipeline and data parallel sizes, API servers, model size, KV cache dtype and context length.
Whatever the inputs, the plan either refuses in one line or what every process of vLLM will hold
fits the memory limit, and its threads fit the CPUs; a refusal that names a memory limit is
answered by a plan at that limit. Counterexamples are printed by hypothesis when a property fails.
"""

from __future__ import annotations

import math
import os
import re

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vllm_intel.supervisor import plan as pl
from vllm_intel.supervisor import workload as wl
from vllm_intel.supervisor.context import Context
from vllm_intel.supervisor.errors import ConfigError
from vllm_intel.supervisor.limits import GiB, Limits, MiB
from vllm_intel.supervisor.workload import Workload

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))  # nightly 300
SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
NAMED_LIMIT = re.compile(r"memory limit \(.*?\) to at least ([0-9]+) GiB")


@st.composite
def limits(draw) -> Limits:
    smt = draw(st.sampled_from([1, 2]))
    cores = draw(st.integers(1, 128))
    cpus = tuple(range(cores * smt))
    n_nodes = draw(st.integers(0, min(8, cores)))  # 0: no NUMA information
    per = math.ceil(len(cpus) / max(n_nodes, 1))
    nodes = {n: cpus[n * per : (n + 1) * per] for n in range(n_nodes) if cpus[n * per :]}
    quota = draw(
        st.none() | st.floats(0.1, len(cpus) + 4, allow_nan=False).map(lambda q: round(q, 2))
    )
    memory = draw(st.none() | st.integers(128 * MiB, 2048 * GiB))
    core_of = {c: c // smt for c in cpus}
    return Limits("v2", cpus, quota, memory, cores, nodes, core_of)


@st.composite
def workloads(draw) -> Workload:
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2]))
    shm = dp * sum(size for _, size in wl._segments([], tp, pp, {}))
    weights = draw(st.none() | st.integers(0, 400 * GiB))
    ctx = draw(
        st.none()
        | st.builds(
            Context,
            tokens=st.integers(16, 1 << 20),
            source=st.just("--max-model-len"),
            layers=st.integers(1, 128),
            kv_heads=st.integers(1, 16),
            head_dim=st.sampled_from([32, 64, 128, 256]),
            dtype_bytes=st.sampled_from([1, 2]),  # fp8, bf16
        )
    )
    api = draw(st.integers(1, dp + 2))
    return Workload(tp, pp, shm, weights, ctx, dp=dp, api_servers=api)


def memory_refusal(e: ConfigError) -> int | None:
    """The memory limit (bytes) a refusal names, if it names one."""
    m = NAMED_LIMIT.search(str(e))
    return int(m.group(1)) * GiB if m else None


@SETTINGS
@given(limits(), workloads(), st.sampled_from([{}, {"INTEL_VLLM_CPU_PLAN": "0"}]))
@example(  # two workers under a limit sized as if one held the KV cache: refused, not OOM-killed
    Limits("v2", (0, 1), None, 6 * GiB, 2),
    Workload(2, 1, 688 * MiB, 0, None),
    {},
)
def test_every_process_fits_or_the_plan_refuses_in_one_line(lim, work, env):
    try:
        p = pl.plan(lim, work, env)
    except ConfigError as e:
        assert "\n" not in str(e) and str(e), e
        named = memory_refusal(e)
        if named is not None:  # the limit it names is one the plan accepts
            assert named > (lim.memory or 0), e
            again = pl.plan(Limits(**{**lim.__dict__, "memory": named}), work, env)
            assert again.kv_gib is None or again.kv_gib >= 1, e
        return
    if p.kv_gib is not None and lim.memory is not None:
        held = pl.memory_needed(work, p.kv_gib)
        assert held <= lim.memory * (1 - pl.MEMORY_HEADROOM), (p.line(), held)
        # and the plan left nothing on the table: one GiB more per worker would not fit
        assert pl.memory_needed(work, p.kv_gib + 1) > lim.memory * (1 - pl.MEMORY_HEADROOM)
    if p.omp_threads is not None:
        assert p.omp_threads >= 1
        assert p.omp_threads * work.workers <= max(math.floor(lim.quota or 0), work.workers)
        assert p.omp_threads * work.workers <= len(lim.cpus)
    if p.rank_cpus is not None:
        flat = [c for r in p.rank_cpus for c in r]
        assert len(p.rank_cpus) == work.workers and all(p.rank_cpus), p.rank_cpus
        assert len(flat) == len(set(flat)) and set(flat) <= set(lim.cpus)
        assert p.binding.count("|") == work.workers - 1


@SETTINGS
@given(limits(), workloads())
def test_more_memory_never_gives_a_smaller_kv_cache(lim, work):
    def kv(memory):
        try:
            return pl.plan(Limits(**{**lim.__dict__, "memory": memory}), work, {}).kv_gib or 0
        except ConfigError:
            return 0

    if lim.memory is not None:
        assert kv(lim.memory + GiB) >= kv(lim.memory)


@SETTINGS
@given(workloads(), st.integers(1, 64))
def test_least_memory_is_the_edge_for_every_worker_count(work, kv_gib):
    work = Workload(work.tp, work.pp, work.shm_needed, work.weights, None, dp=work.dp)
    edge = pl.least_memory(work, kv_gib)
    at = pl.plan(Limits("v2", (0,), None, edge, 1), work, {"OMP_NUM_THREADS": "1"})
    assert at.kv_gib == kv_gib
    # each of the workers allocates it: the sum over the processes is what the edge holds
    assert (
        pl.memory_needed(work, kv_gib)
        == sum(p.count * p.each for p in pl.processes(work, kv_gib)) + work.shm_needed
    )
    assert [p.count for p in pl.processes(work, kv_gib)] == [1, work.dp, work.workers]
