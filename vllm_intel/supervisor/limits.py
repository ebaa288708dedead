"""What the container gives vLLM: the CPUs it may run on, the CPU quota, the memory limit, the
NUMA nodes and the physical cores, read from cgroup v2 or v1 and sysfs.

Read-only and cheap (a few small files, no vLLM import). The roots (/sys/fs/cgroup,
/sys/devices/system) are parameters so that tests can hand it fake trees.
"""

from __future__ import annotations

import os
import pathlib
import signal
from dataclasses import dataclass, field

from .errors import ConfigError, parse_whole

MiB = 1 << 20
GiB = 1 << 30
CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")
SYS_ROOT = pathlib.Path("/sys/devices/system")
V1_UNLIMITED = 1 << 62  # cgroup v1 reports "no limit" as a value near PAGE_COUNTER_MAX


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


def read_text(path: pathlib.Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text: str | None) -> int | None:
    """A number of a cgroup file; None for `max`, nothing, or what is not a number."""
    try:
        return parse_whole("cgroup value", text) if text not in (None, "", "max") else None
    except ConfigError:
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


def own_paths(self_cgroup: str) -> dict[str, str]:
    """controller -> this process's cgroup path, from /proc/self/cgroup ('' key = v2)."""
    paths = {}
    for line in self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctrl in parts[1].split(",") if parts[1] else [""]:
                paths[ctrl] = parts[2].strip()
    return paths


def walk(base: pathlib.Path, own: str) -> list[pathlib.Path]:
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


def _v2(root: pathlib.Path, own: dict[str, str]) -> tuple[float | None, int | None, str | None]:
    """(quota, memory, cpuset) of a cgroup v2 hierarchy."""
    dirs = walk(root, own.get("", ""))

    def quota(d):
        parts = (read_text(d / "cpu.max") or "max").split()
        q, period = _int(parts[0]), _int(parts[1]) if len(parts) > 1 else 100000
        return q / period if q and period else None

    return (
        _min(quota(d) for d in dirs),
        _min(_int(read_text(d / "memory.max")) for d in dirs),
        read_text(dirs[0] / "cpuset.cpus.effective"),
    )


def _v1(root: pathlib.Path, own: dict[str, str]) -> tuple[float | None, int | None, str | None]:
    """(quota, memory, cpuset) of cgroup v1 controllers."""
    quota = memory = None
    cpu_dir = next((root / c for c in ("cpu", "cpu,cpuacct") if (root / c).is_dir()), None)
    if cpu_dir is not None:

        def v1_quota(d):
            q = _int(read_text(d / "cpu.cfs_quota_us"))
            period = _int(read_text(d / "cpu.cfs_period_us"))
            return q / period if q and q > 0 and period else None

        quota = _min(v1_quota(d) for d in walk(cpu_dir, own.get("cpu", "")))
    mem_dir = root / "memory"
    if mem_dir.is_dir():
        values = (
            _int(read_text(d / "memory.limit_in_bytes"))
            for d in walk(mem_dir, own.get("memory", ""))
        )
        memory = _min(v for v in values if v is not None and v < V1_UNLIMITED)
    cpuset_dir = walk(root / "cpuset", own.get("cpuset", ""))[0]
    return quota, memory, read_text(cpuset_dir / "cpuset.effective_cpus")


def _topology(sys_root: pathlib.Path, cpus: set[int]) -> tuple[dict, dict]:
    """(NUMA node -> its CPUs among `cpus`, each CPU's physical core)."""
    nodes = {}
    for node_dir in sorted((sys_root / "node").glob("node[0-9]*")):
        listed = read_text(node_dir / "cpulist")
        if listed is not None:
            mine = tuple(c for c in parse_cpu_list(listed) if c in cpus)
            if mine:
                nodes[int(node_dir.name[4:])] = mine
    core_of = {}
    for cpu in cpus:
        topo = sys_root / "cpu" / f"cpu{cpu}" / "topology"
        core = read_text(topo / "core_id")
        core_of[cpu] = (read_text(topo / "physical_package_id"), core) if core is not None else cpu
    return nodes, core_of


def read_limits(
    cgroup_root: pathlib.Path = CGROUP_ROOT,
    sys_root: pathlib.Path = SYS_ROOT,
    affinity: set[int] | None = None,
    self_cgroup: str | None = None,
) -> Limits:
    if affinity is None:
        affinity = set(os.sched_getaffinity(0))
    if self_cgroup is None:
        self_cgroup = read_text(pathlib.Path("/proc/self/cgroup")) or ""
    own = own_paths(self_cgroup)
    quota = memory = cpuset = None
    if (cgroup_root / "cgroup.controllers").exists():
        kind = "v2"
        quota, memory, cpuset = _v2(cgroup_root, own)
    elif any((cgroup_root / c).is_dir() for c in ("cpu", "cpu,cpuacct", "memory")):
        kind = "v1"
        quota, memory, cpuset = _v1(cgroup_root, own)
    else:
        kind = "none"
    cpus = set(affinity)
    if cpuset:
        cpus &= set(parse_cpu_list(cpuset))
    cpus = cpus or set(affinity)
    nodes, core_of = _topology(sys_root, cpus)
    cores = len(set(core_of.values()))
    return Limits(kind, tuple(sorted(cpus)), quota, memory, cores, nodes, core_of)


def oom_kills(
    cgroup_root: pathlib.Path = CGROUP_ROOT, self_cgroup: str | None = None
) -> int | None:
    """How many processes of this process's cgroup the kernel's OOM killer has killed (v2:
    memory.events `oom_kill`, which counts the cgroups below it too; v1: memory.oom_control's),
    None where the kernel does not say. Cheap: one small file."""
    if self_cgroup is None:
        self_cgroup = read_text(pathlib.Path("/proc/self/cgroup")) or ""
    own = own_paths(self_cgroup)
    if (cgroup_root / "cgroup.controllers").exists():
        path = walk(cgroup_root, own.get("", ""))[0] / "memory.events"
    else:
        path = walk(cgroup_root / "memory", own.get("memory", ""))[0] / "memory.oom_control"
    for line in (read_text(path) or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return _int(value)
    return None


# Where a memory limit is set: every line that asks for a higher one names these.
LIMIT_FLAGS = "(docker run --memory, compose mem_limit, k8s limits.memory)"
OOM_ADVICE = (
    f"raise the memory limit {LIMIT_FLAGS} or lower VLLM_CPU_KVCACHE_SPACE, --max-model-len or "
    "--tensor-parallel-size"
)


def oom_cause(before: int | None, returncode: int) -> str:
    """ "; the kernel's OOM killer killed ..." for the exit line when this cgroup's OOM kills
    moved since `before` (read at vLLM's spawn), else "". vLLM's returncode -9: its API server
    was the one killed; any other: one of its other processes (vLLM then exits 1, its engine
    dead)."""
    after = oom_kills()
    if before is None or after is None or after <= before:
        return ""
    if returncode == -signal.SIGKILL:
        who = "vLLM's API server"
    else:
        who = "a process of vLLM (engine core / worker)"
    memory = read_limits().memory
    if memory is None:
        limit = "with no memory limit (the host's memory ran out)"
    elif memory >= GiB:
        limit = f"at the memory limit of {memory / GiB:.1f} GiB"
    else:
        limit = f"at the memory limit of {memory // MiB} MiB"
    return f"; the kernel's OOM killer killed {who} {limit}: {OOM_ADVICE}"
