"""The CPU plan and the preflight over fake cgroup / sysfs trees (limits, workload, plan):
quota below, equal to and above the affinity set, memory limits, cgroup v1 and v2, no limits,
the user's values winning, and the one-line errors."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from tests.harness import ROOT
from vllm_intel.supervisor import limits as lm
from vllm_intel.supervisor import plan as pl
from vllm_intel.supervisor import workload
from vllm_intel.supervisor.errors import ConfigError, Exit

GiB, MiB = lm.GiB, lm.MiB


def tree(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


def sysfs(root: pathlib.Path, nodes: dict[int, str], smt: int = 0):
    """nodes: node -> cpulist; smt: logical CPUs per core (0: no topology files, as in a
    sandbox that hides them: every CPU then counts as a core)."""
    files = {f"node/node{n}/cpulist": cpus for n, cpus in nodes.items()}
    if smt:
        for n, cpus in nodes.items():
            for cpu in lm.parse_cpu_list(cpus):
                files[f"cpu/cpu{cpu}/topology/core_id"] = str(cpu // smt)
                files[f"cpu/cpu{cpu}/topology/physical_package_id"] = "0"
    return tree(root, files)


def v2(tmp_path, cpu_max="max", memory_max="max", cpuset=None, extra=None):
    files = {
        "cgroup.controllers": "cpuset cpu memory",
        "cpu.max": cpu_max,
        "memory.max": memory_max,
    }
    if cpuset:
        files["cpuset.cpus.effective"] = cpuset
    return tree(tmp_path / "cg", {**files, **(extra or {})})


def limits(tmp_path, cg, cpus=range(4), nodes=None, self_cgroup="", smt=0):
    sys_root = sysfs(tmp_path / "sys", nodes or {0: lm.format_cpu_list(cpus)}, smt)
    return lm.read_limits(cg, sys_root, affinity=set(cpus), self_cgroup=self_cgroup)


def plan(lim, flags=(), env=None, model=None):
    """The entrypoint's way: the workload read once, then the pure plan."""
    env = env or {}
    return pl.plan(lim, workload.workload(list(flags), model, env), env)


# ---------------------------------------------------------------------------- reading limits


def test_v2_quota_memory_and_cpuset(tmp_path):
    lim = limits(tmp_path, v2(tmp_path, "150000 100000", str(6 * GiB), cpuset="0-2"))
    assert (lim.cgroup, lim.quota, lim.memory, lim.cpus) == ("v2", 1.5, 6 * GiB, (0, 1, 2))


def test_v2_limit_of_an_ancestor_applies(tmp_path):
    """A pod's limit sits on the pod's cgroup, the container's own one says max."""
    cg = v2(tmp_path, extra={"pod/cpu.max": "50000 100000", "pod/c1/cpu.max": "max 100000"})
    lim = limits(tmp_path, cg, self_cgroup="0::/pod/c1\n")
    assert lim.quota == 0.5


def test_v1_quota_and_memory(tmp_path):
    cg = tree(
        tmp_path / "cg",
        {
            "cpu,cpuacct/cpu.cfs_quota_us": "200000",
            "cpu,cpuacct/cpu.cfs_period_us": "100000",
            "memory/memory.limit_in_bytes": str(4 * GiB),
            "cpuset/cpuset.effective_cpus": "0-3",
        },
    )
    lim = limits(tmp_path, cg)
    assert (lim.cgroup, lim.quota, lim.memory) == ("v1", 2.0, 4 * GiB)


def test_v1_unlimited(tmp_path):
    cg = tree(
        tmp_path / "cg",
        {
            "cpu/cpu.cfs_quota_us": "-1",
            "cpu/cpu.cfs_period_us": "100000",
            "memory/memory.limit_in_bytes": "9223372036854771712",
        },
    )
    lim = limits(tmp_path, cg)
    assert (lim.cgroup, lim.quota, lim.memory) == ("v1", None, None)


def test_no_cgroup_at_all(tmp_path):
    (tmp_path / "cg").mkdir()
    lim = limits(tmp_path, tmp_path / "cg", smt=2)
    assert (lim.cgroup, lim.quota, lim.memory, lim.cpus) == ("none", None, None, (0, 1, 2, 3))
    p = plan(lim)
    assert p.env == {"VLLM_CPU_KVCACHE_SPACE": "1"}


# ---------------------------------------------------------------------------- threads


@pytest.mark.parametrize(
    "quota, threads",
    [
        ("100000 100000", "1"),  # 1 CPU of 4: one thread
        ("150000 100000", "1"),  # floor: 1.5 CPUs -> 1
        ("50000 100000", "1"),  # below one CPU: still one (vLLM needs one per worker)
        ("300000 100000", "3"),  # 3 CPUs of 4
    ],
)
@pytest.mark.parametrize("mode", ["", "1"])
def test_quota_below_the_affinity_set_sets_floor_quota_threads(tmp_path, quota, threads, mode):
    env = {"INTEL_VLLM_CPU_PLAN": mode} if mode else {}
    p = plan(limits(tmp_path, v2(tmp_path, quota)), env=env)
    # Not vLLM's binding: other containers may share these CPUs, and all binding alike collide.
    assert p.env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert p.env["OMP_NUM_THREADS"] == threads
    assert f"OMP_NUM_THREADS={threads}" in p.line()
    assert "not pinned" in p.line(), p.line()


@pytest.mark.parametrize("quota", ["400000 100000", "800000 100000", "max 100000"])
def test_quota_equal_or_above_or_none_leaves_vllm_auto(tmp_path, quota):
    p = plan(limits(tmp_path, v2(tmp_path, quota)))
    assert "VLLM_CPU_OMP_THREADS_BIND" not in p.env and "OMP_NUM_THREADS" not in p.env
    assert "vLLM auto over the 4 allowed CPUs" in p.line()


def test_tensor_parallel_shares_the_quota_between_workers(tmp_path):
    lim = limits(tmp_path, v2(tmp_path, "400000 100000"), range(8), nodes={0: "0-3", 1: "4-7"})
    p = plan(lim, ["--tensor-parallel-size", "2"])
    assert p.env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and p.env["OMP_NUM_THREADS"] == "2"


def test_parallel_sizes_come_from_the_config_file_as_vllm_reads_them(tmp_path):
    """TP/PP from `--config FILE` count like flags; the command line beats the file."""
    lim = limits(tmp_path, v2(tmp_path, "400000 100000"), range(8))
    conf = tmp_path / "serve.yaml"
    conf.write_text("tensor-parallel-size: 2\npipeline_parallel_size: 2\n")
    p = plan(lim, ["--config", str(conf)])
    assert p.env["OMP_NUM_THREADS"] == "1" and "x 4 worker(s)" in p.line(), p.line()
    assert len(workload.shm_segments(["--config", str(conf)])) > len(workload.shm_segments([]))
    p = plan(lim, ["--config", str(conf), "-tp", "1", "-pp", "1"])
    assert p.env["OMP_NUM_THREADS"] == "4" and "x 1 worker(s)" in p.line(), p.line()
    with pytest.raises(ConfigError, match="--tensor-parallel-size must be a whole number >= 1"):
        plan(lim, ["-tp", "0"])


def test_tensor_parallel_larger_than_the_cpus_is_one_line_error(tmp_path):
    lim = limits(tmp_path, v2(tmp_path, "100000 100000"), range(2))
    with pytest.raises(ConfigError, match="3 vLLM CPU workers"):
        plan(lim, ["-tp", "3"])


def test_under_a_quota_the_shm_readers_sleep_unless_the_user_says(tmp_path):
    spin = "VLLM_SHM_BROADCAST_BUSY_SLEEP_S"
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    quota = limits(a, v2(a, "100000 100000"))
    assert plan(quota, env={"INTEL_VLLM_CPU_PLAN": "1"}).env[spin] == "0.0001"  # unpinned
    # No quota, 4 CPUs on 2 SMT cores: vLLM's auto binding takes one CPU of one core, 3 spare.
    assert spin not in plan(limits(b, v2(b, "max 100000"), smt=2)).env
    p = plan(quota, env={spin: "0.002", "INTEL_VLLM_CPU_PLAN": "1"})
    assert spin not in p.env and f"{spin}=0.002 (yours)" in p.line()
    p = plan(quota, env={spin: "0", "INTEL_VLLM_CPU_PLAN": "1"})  # vLLM's spin, asked for: kept
    assert spin not in p.env and f"{spin}=0 (yours)" in p.line()
    assert spin not in plan(quota, env={"INTEL_VLLM_CPU_PLAN": "0"}).env
    with pytest.raises(ConfigError, match=f"{spin} must be seconds between 0 and 0.01, not 'x'"):
        plan(quota, env={spin: "x"})


@pytest.mark.parametrize(
    "cpus, smt, quota, sleeps",
    [
        (2, 1, "max", True),  # 2 cores: 1 OpenMP thread, 1 CPU for API server + engine core
        (1, 1, "max", False),  # one CPU: sched_yield hands it straight to the work
        (8, 1, "max", True),  # 8 cores, no SMT: still only the one reserved CPU beside them
        (8, 2, "max", False),  # 4 cores x 2: 3 OpenMP threads, 5 CPUs to spare
        (4, 2, "max", False),  # 2 cores x 2: 1 OpenMP thread, 3 to spare
        (2, 2, "max", True),  # 1 core x 2: vLLM still runs one thread per worker: 1 spare
        (8, 2, "200000 100000", True),  # under a quota, whatever the topology
    ],
)
def test_without_cpus_to_spare_the_shm_readers_sleep(tmp_path, cpus, smt, quota, sleeps):
    """vLLM's auto binding gives its OpenMP threads one CPU per physical core but the engine
    core's (one per worker); the API server and the engine core share the rest. With fewer than
    two CPUs left, the engine core's spinning reader takes the API server's CPU."""
    p = plan(limits(tmp_path, v2(tmp_path, f"{quota} 100000"), range(cpus), smt=smt))
    assert ("VLLM_SHM_BROADCAST_BUSY_SLEEP_S" in p.env) is sleeps, p.line()
    if quota == "max":
        omp = max(cpus // smt - 1, 1)
        assert f"{cpus - omp} beside its OpenMP threads" in p.line(), p.line()


def test_topology_counts_smt_siblings_once(tmp_path):
    assert limits(tmp_path, v2(tmp_path), range(8), smt=2).cores == 4
    assert limits(tmp_path / "n", v2(tmp_path / "n"), range(8)).cores == 8  # no files


def test_users_bind_wins_and_is_logged_as_yours(tmp_path):
    lim = limits(tmp_path, v2(tmp_path, "100000 100000"))
    p = plan(lim, env={"VLLM_CPU_OMP_THREADS_BIND": "1-3"})
    assert "VLLM_CPU_OMP_THREADS_BIND" not in p.env and "OMP_NUM_THREADS" not in p.env
    assert "VLLM_CPU_OMP_THREADS_BIND=1-3 (yours)" in p.line()
    p = plan(lim, env={"OMP_NUM_THREADS": "2"})
    assert "VLLM_CPU_OMP_THREADS_BIND" not in p.env and "OMP_NUM_THREADS" not in p.env
    assert "OMP_NUM_THREADS=2 (yours)" in p.line()


def test_plan_off_sets_nothing(tmp_path):
    p = plan(
        limits(tmp_path, v2(tmp_path, "100000 100000", str(8 * GiB))),
        env={"INTEL_VLLM_CPU_PLAN": "0"},
    )
    assert p.env == {} and "plan: off" in p.line()
    with pytest.raises(ConfigError, match="INTEL_VLLM_CPU_PLAN"):
        plan(limits(tmp_path, v2(tmp_path)), env={"INTEL_VLLM_CPU_PLAN": "yes"})


# ---------------------------------------------------------------------------- KV cache / memory


def test_kv_cache_from_memory_max(tmp_path):
    p = plan(limits(tmp_path, v2(tmp_path, memory_max=str(8 * GiB))))
    # 8 GiB - 10 % - 2 GiB runtime - 400 MiB shm = 4.8 GiB -> 4
    assert p.env["VLLM_CPU_KVCACHE_SPACE"] == "4"


def test_kv_cache_counts_local_weights(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    with open(model / "model.safetensors", "wb") as f:
        f.truncate(2 * GiB)  # sparse: size without the disk
    p = plan(limits(tmp_path, v2(tmp_path, memory_max=str(8 * GiB))), model=str(model))
    # 8 GiB - 10 % - weights 2 GiB - runtime (2 + 2/2) GiB - 400 MiB shm = 1.8 GiB -> 1
    assert p.env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def weights_dir(tmp_path, size: int, config: dict | None) -> str:
    model = tmp_path / "model"
    model.mkdir()
    with open(model / "model.safetensors", "wb") as f:
        f.truncate(size)  # sparse: size without the disk
    if config is not None:
        (model / "config.json").write_text(json.dumps(config))
    return str(model)


@pytest.mark.parametrize(
    "flags, config, held",
    [
        ((), {"torch_dtype": "bfloat16"}, 1),
        (("--dtype", "float32"), {"torch_dtype": "bfloat16"}, 2),  # cast up: twice the files
        (("--dtype", "FLOAT"), {"dtype": "float16"}, 2),  # newer configs' key; vLLM lowers it
        (("--dtype=float32",), {"torch_dtype": "float32"}, 1),
        # a float32 checkpoint served in 16 bits: still the files' size (mapped whole to load)
        (("--dtype", "bfloat16"), {"torch_dtype": "float32"}, 1),
        ((), {"torch_dtype": "float32"}, 1),
        # not known: the files as they are
        (("--dtype", "float32"), {}, 1),
        (("--dtype", "float32"), None, 1),
        (("--dtype", "float32"), {"torch_dtype": ["bfloat16"]}, 1),
        (("--dtype", "float32"), {"torch_dtype": "bfloat16", "quantization_config": {}}, 1),
        (("--dtype", "float64"), {"torch_dtype": "bfloat16"}, 1),  # vLLM refuses it itself
    ],
)
def test_the_weights_count_as_vllm_holds_them_for_its_dtype(tmp_path, flags, config, held):
    model = weights_dir(tmp_path, GiB, config)
    assert workload.workload(list(flags), model, {}).weights == held * GiB


def test_a_16_bit_model_served_in_float32_needs_the_limit_for_twice_its_weights(tmp_path):
    """What vLLM holds, not the files: at a limit that fits the 16-bit weights the float32 run
    is refused in one line before anything starts, naming the limit that fits it."""
    model = weights_dir(tmp_path, 2 * GiB, {"torch_dtype": "bfloat16"})
    lim = limits(tmp_path, v2(tmp_path, memory_max=str(8 * GiB)))
    assert plan(lim, model=model).env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    with pytest.raises(ConfigError) as e:
        plan(lim, ["--dtype", "float32"], model=model)
    assert "\n" not in str(e.value) and "weights 4.0 GiB" in str(e.value), str(e.value)


def test_no_memory_limit_keeps_one_gib(tmp_path):
    assert plan(limits(tmp_path, v2(tmp_path)), []).env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_memory_too_small_is_one_line_error_naming_the_fix(tmp_path):
    with pytest.raises(ConfigError) as e:
        plan(limits(tmp_path, v2(tmp_path, memory_max=str(2 * GiB))))
    msg = str(e.value)
    assert (
        "\n" not in msg and "--memory" in msg and "limits.memory" in msg and "at least 4 GiB" in msg
    )


def test_users_kv_wins_and_is_checked(tmp_path):
    lim = limits(tmp_path, v2(tmp_path, memory_max=str(8 * GiB)))
    p = plan(lim, env={"VLLM_CPU_KVCACHE_SPACE": "5"})
    assert "VLLM_CPU_KVCACHE_SPACE" not in p.env and "5 GiB (yours)" in p.line()
    with pytest.raises(ConfigError, match="VLLM_CPU_KVCACHE_SPACE=6 GiB .* at least 9 GiB"):
        plan(lim, env={"VLLM_CPU_KVCACHE_SPACE": "6"})


# ---------------------------------------------------------------------------- /dev/shm


def test_shm_requirement_is_vllms_ring_buffers():
    """TP=1: the executor's broadcast queue (16 MiB x 10) + the worker's response queue
    (24 MiB x 10), each chunk with 1 + readers flag bytes (shm_broadcast.ShmRingBuffer)."""
    assert workload.shm_segments([], {}) == [
        ("executor broadcast queue", (16 * MiB + 2) * 10),
        ("worker response queue", (24 * MiB + 2) * 10),
    ]
    assert sum(s for _, s in workload.shm_segments([], {"VLLM_MQ_MAX_CHUNK_BYTES_MB": "4"})) == (
        (4 * MiB + 2) * 10 + (24 * MiB + 2) * 10
    )
    arena = dict(workload.shm_segments(["--enable-shm-tensor-arena"], {}))["tensor arena"]
    assert arena == (256 * MiB + 2) * 8


def test_shm_too_small_is_one_line_error_naming_the_fixes(tmp_path):
    free = __import__("shutil").disk_usage(tmp_path).free
    workload.check_shm(tmp_path, 400 * MiB)  # plenty here
    with pytest.raises(ConfigError) as e:
        workload.check_shm(tmp_path, free + GiB)
    msg = str(e.value)
    assert "\n" not in msg
    assert "docker run --shm-size=" in msg and "shm_size" in msg and "emptyDir" in msg


def test_plan_subcommand_prints_one_line(tmp_path, tiny_model):
    out = subprocess.run(
        [sys.executable, str(ROOT / "entrypoint.py"), "plan", str(tiny_model)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "INTEL_VLLM_SHM_DIR": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("plan: cgroup ") and out.stdout.count("\n") == 1
    assert "VLLM_CPU_KVCACHE_SPACE=" in out.stdout


def test_plan_subcommand_exits_64_when_memory_is_short(tmp_path, tiny_model):
    out = subprocess.run(
        [sys.executable, str(ROOT / "entrypoint.py"), "plan", str(tiny_model)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "VLLM_CPU_KVCACHE_SPACE": "x"},
    )
    assert out.returncode == Exit.CONFIG
    assert out.stderr.count("\n") == 1 and "VLLM_CPU_KVCACHE_SPACE must be whole GiB" in out.stderr
