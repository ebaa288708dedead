"""plan() as a pure function: typed inputs (Limits, Workload, an env dict) in, a typed Plan out;
no file read, no process started. The fake-tree tests (test_resources.py) cover reading the
inputs; these pin the decision itself."""

from __future__ import annotations

import pytest

from vllm_intel.supervisor import plan as pl
from vllm_intel.supervisor.errors import ConfigError
from vllm_intel.supervisor.limits import GiB, Limits, MiB
from vllm_intel.supervisor.workload import Workload

ONE = Workload(tp=1, pp=1, shm_needed=400 * MiB, weights=1 * GiB)


def node(cpus: int, quota=None, memory=None, smt: int = 1) -> Limits:
    return Limits("v2", tuple(range(cpus)), quota, memory, cores=cpus // smt)


@pytest.mark.parametrize(
    "limits, env, want",
    [
        # a quota below the node's CPUs: floor(quota) threads, nobind, readers wait
        (node(64, 4.0, 16 * GiB), {}, dict(omp_threads=4, binding="nobind", readers_wait=True)),
        (node(64, 0.5), {}, dict(omp_threads=1, binding="nobind", kv_gib=pl.KV_DEFAULT_GIB)),
        # no quota below the CPUs: vLLM's auto binding; its spin kept only with 2 CPUs to spare
        (node(16), {}, dict(omp_threads=None, binding=None, readers_wait=True, spare_cpus=1)),
        (node(16, smt=2), {}, dict(omp_threads=None, spare_cpus=9, readers_wait=False)),
        (node(2), {}, dict(omp_threads=None, readers_wait=True, spare_cpus=1)),
        # off: nothing of ours
        (
            node(64, 4.0, 16 * GiB),
            {"INTEL_VLLM_CPU_PLAN": "0"},
            dict(omp_threads=None, kv_gib=None),
        ),
        # yours win
        (node(64, 4.0), {"OMP_NUM_THREADS": "8"}, dict(omp_threads=None, binding=None)),
        (node(64, None, 16 * GiB), {"VLLM_CPU_KVCACHE_SPACE": "3"}, dict(kv_gib=None)),
    ],
)
def test_plan_decides_from_typed_inputs(limits, env, want):
    p = pl.plan(limits, ONE, env)
    assert {k: getattr(p, k) for k in want} == want, p.line()


def test_kv_cache_is_the_memory_limit_less_what_else_vllm_holds():
    # 16 GiB - 10 % headroom - weights 1 GiB - runtime (2 + 1/2) GiB - shm 400 MiB = 10.5 -> 10
    p = pl.plan(node(8, 4.0, 16 * GiB), ONE, {})
    assert p.kv_gib == 10 and p.env["VLLM_CPU_KVCACHE_SPACE"] == "10"
    # two workers, each with half the weights and a KV cache of its own: 14.4 - weights 6 - API
    # server and engine core 1.25 - 2 x (worker 0.75 + 3 / 2) - shm 0.4 = 2.26, 1.13 per worker
    big = Workload(tp=2, pp=1, shm_needed=ONE.shm_needed, weights=6 * GiB)
    assert pl.plan(node(8, 4.0, 16 * GiB), big, {}).kv_gib == 1
    assert pl.plan(node(8, 4.0, 16 * GiB), big, {}).omp_threads == 2  # 4 CPUs, 2 workers
    # not a local directory: weights unknown, the base allowance alone
    hub = Workload(tp=1, pp=1, shm_needed=ONE.shm_needed, weights=None)
    assert pl.runtime_bytes(hub) == pl.RUNTIME_BYTES
    assert pl.plan(node(8, 4.0, 16 * GiB), hub, {}).kv_gib == 12  # 14.4 - 2 - 0.4


@pytest.mark.parametrize("work", [ONE, Workload(tp=2, pp=1, shm_needed=7 * MiB, weights=None)])
@pytest.mark.parametrize("kv", [1, 3])
def test_least_memory_is_the_edge_of_the_plan(work, kv):
    """least_memory: the plan gives that KV cache there, and 1 MiB less gives less (or refuses)."""
    edge = pl.least_memory(work, kv)
    assert edge % MiB == 0
    assert pl.plan(node(8, None, edge), work, {}).kv_gib == kv
    if kv == 1:
        with pytest.raises(ConfigError, match=f"to at least {-(-edge // GiB)} GiB"):
            pl.plan(node(8, None, edge - MiB), work, {})
    else:
        assert pl.plan(node(8, None, edge - MiB), work, {}).kv_gib == kv - 1


def test_the_plan_is_a_value_and_its_env_follows_its_fields():
    p = pl.plan(node(64, 4.0, 16 * GiB), ONE, {})
    assert p == pl.plan(node(64, 4.0, 16 * GiB), ONE, {})  # same inputs, same plan
    assert p.env == {
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "4",
        pl.SPIN: pl.SPIN_SLEEP_S,
        "VLLM_CPU_KVCACHE_SPACE": "10",
    }
    with pytest.raises(AttributeError):
        p.kv_gib = 1  # frozen


@pytest.mark.parametrize(
    "limits, work, env, message",
    [
        (node(2, 1.0), Workload(3, 1, 0, None), {}, "3 vLLM CPU workers"),
        (node(8, None, 3 * GiB), ONE, {}, "at least 6 GiB"),
        (node(8), ONE, {"INTEL_VLLM_CPU_PLAN": "yes"}, "must be one of 0, 1, not 'yes'"),
        # the pin was deleted (docs/decisions/0002-delete-the-pin.md): refused like any other
        (node(8, 1.0), ONE, {"INTEL_VLLM_CPU_PLAN": "pin"}, "must be one of 0, 1, not 'pin'"),
    ],
)
def test_what_cannot_fit_is_a_one_line_error(limits, work, env, message):
    with pytest.raises(ConfigError, match=message) as e:
        pl.plan(limits, work, env)
    assert "\n" not in str(e.value)


def test_another_device_has_no_cpu_plan():
    p = pl.plan(node(8, 1.0, 8 * GiB), ONE, {}, device="xpu")
    assert p.env == {} and p.line().startswith("plan: xpu: no CPU plan")


BOTH = pl.Libraries(
    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "/opt/venv/lib/libiomp5.so"
)


@pytest.mark.parametrize(
    "limits, env, libs, preload, waits",
    [
        # upstream's image: tcmalloc first, then Intel OpenMP; vLLM's auto binding sets the waits
        (node(16), {}, BOTH, BOTH.preload, False),
        # nobind (a quota below the CPUs): vLLM sets nothing, the plan sets vLLM's own waits
        (node(64, 4.0), {}, BOTH, BOTH.preload, True),
        # only what is found; GNU OpenMP needs no wait setting of ours
        (node(64, 4.0), {}, pl.Libraries(BOTH.tcmalloc, None), (BOTH.tcmalloc,), False),
        (node(16), {}, pl.Libraries(), (), False),
        # yours, or the plan off: nothing preloaded by us
        (node(16), {"LD_PRELOAD": "/x/libjemalloc.so"}, BOTH, (), False),
        (node(64, 4.0), {"INTEL_VLLM_CPU_PLAN": "0"}, BOTH, (), False),
        # your wait kept, the other one set
        (node(64, 4.0), {"KMP_BLOCKTIME": "0"}, BOTH, BOTH.preload, True),
    ],
)
def test_the_runtime_is_preloaded_with_the_waits_its_openmp_reads(
    limits, env, libs, preload, waits
):
    p = pl.plan(limits, ONE, env, libs=libs)
    assert p.preload == preload
    assert p.env.get("LD_PRELOAD") == (":".join(preload) if preload else None)
    for k, v in pl.IOMP_WAITS.items():
        assert p.env.get(k) == (v if waits and k not in env else None), p.env
    assert ("runtime: " in p.line()) == p.enabled


def test_the_plan_line_says_which_runtime_and_what_is_missing():
    assert "runtime: tcmalloc + Intel OpenMP;" in pl.plan(node(16), ONE, {}, libs=BOTH).line()
    line = pl.plan(node(16), ONE, {}, libs=pl.Libraries()).line()
    assert (
        "runtime: glibc malloc + GNU OpenMP (torch's): libtcmalloc_minimal.so.4 not found" in line
    )
    assert "libtcmalloc-minimal4" in line and "intel-openmp" in line
    assert (
        "runtime: yours (LD_PRELOAD)"
        in pl.plan(node(16), ONE, {"LD_PRELOAD": "/a.so"}, libs=BOTH).line()
    )


def test_find_takes_the_system_tcmalloc_else_vllms_bundled_copy(tmp_path):
    from vllm_intel.supervisor import runtime

    system, venv, bundled = tmp_path / "usr", tmp_path / "venv", tmp_path / "vllm-libs"
    for d in (system, venv / "lib", bundled):
        d.mkdir(parents=True)
    assert runtime.find(str(venv), (str(system),), bundled) == runtime.Libraries()
    (bundled / "libtcmalloc_minimal-3ab1c2.so.4.5.16").touch()  # auditwheel's name in vllm/libs
    (venv / "lib" / runtime.IOMP).touch()
    got = runtime.find(str(venv), (str(system),), bundled)
    assert got.tcmalloc.endswith(".so.4.5.16") and got.iomp == str(venv / "lib" / runtime.IOMP)
    (system / runtime.TCMALLOC).touch()
    assert runtime.find(str(venv), (str(system),), bundled).tcmalloc == str(
        system / runtime.TCMALLOC
    )


def test_every_process_vllm_starts_is_counted_from_its_flags(tmp_path):
    """Workers = DP x TP x PP, an engine core per data-parallel rank, API servers as vLLM
    defaults them (one per rank); each worker its own KV cache, its share of the weights."""
    from vllm_intel.supervisor import workload as wl

    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\0" * (4 * MiB))
    work = wl.workload(["--tensor-parallel-size", "2", "--data-parallel-size", "2"], str(model), {})
    assert (work.workers, work.dp, work.api_servers) == (4, 2, 2)
    one = wl.workload(["--tensor-parallel-size", "2"], str(model), {})
    assert work.shm_needed == 2 * one.shm_needed  # an executor's queues per rank
    api, engine, worker = pl.processes(work, 3)
    assert (api.count, engine.count, worker.count) == (2, 2, 4)
    assert worker.kv == 3 * GiB and worker.weights == 2 * MiB  # half the weights: TP 2
    assert wl.workload(["--api-server-count", "3"], str(model), {}).api_servers == 3
    # 4 workers of 1 GiB where 1 would fit: refused naming the limit, and one worker
    with pytest.raises(ConfigError, match=r"x 4 workers .* to at least 10 GiB; or run one worker"):
        pl.plan(node(8, None, 5 * GiB), Workload(4, 1, 0, None), {})


@pytest.mark.parametrize(
    "value, fits", [("1G", True), ("2147483648", True), ("3.5G", False), ("4g", False)]
)
def test_your_kv_cache_flag_is_kept_and_checked_per_worker(value, fits):
    """--kv-cache-memory-bytes is yours: the plan sets no VLLM_CPU_KVCACHE_SPACE, which would
    override it inside vLLM, and every worker's copy of it must fit the limit."""
    work = Workload(2, 1, 0, None, kv_flag=value)
    if fits:
        p = pl.plan(node(8, None, 8 * GiB), work, {})
        assert "VLLM_CPU_KVCACHE_SPACE" not in p.env and p.kv_gib is None, p.line()
        assert f"--kv-cache-memory-bytes {value} per worker x 2 workers (yours)" in p.line()
    else:
        with pytest.raises(ConfigError, match=f"--kv-cache-memory-bytes {value} per worker"):
            pl.plan(node(8, None, 8 * GiB), work, {})
