"""The janitor: what a run leaves in /dev/shm and in its run directory, removed only when it is
provably a dead run's, wherever that run was.

Several servers may share one /dev/shm and one /tmp without seeing each other's processes: two
containers started with `--ipc=host`, containers of one Kubernetes pod sharing a memory
`emptyDir`. A pid proves nothing across PID namespaces; a lock does. So each run holds, for its
whole life, an exclusive flock(2) on two files that live exactly as long as the places they
guard:

- its claim, `<shm_dir>/vllm-intel-run-<id>.claim`, listing its run directory and the shm entries
  its own processes map (recorded while it runs, by `Watcher`);
- `<run dir>/supervisor.lock`.

The kernel releases both locks when the supervisor dies, however it dies, and every process that
opens the same file sees it, in any namespace. A sweep removes what the claim of a dead run lists
(and that no visible process maps), and run directories whose lock is free. An entry that no
claim lists, and a run directory without a lock file, belong to someone we cannot prove dead:
they are reported and left alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import pathlib
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable

import psutil

from .settings import RUN_DIR_PREFIX, TICK_S, log

# Names vLLM (multiprocessing) gives its shared memory segments and semaphores in /dev/shm.
SHM_PATTERNS = (
    re.compile(r"^psm_[0-9a-f]+$"),
    re.compile(r"^sem\.mp-\w+$"),
    re.compile(r"^wnsm_\w+$"),
    re.compile(r"^vllm_intel_wake_[0-9a-f]+$"),  # patch shm-busy-sleep's futex words
)
CLAIM_PREFIX, CLAIM_SUFFIX = "vllm-intel-run-", ".claim"
LOCK_FILE = "supervisor.lock"
# How often the watcher records what the run maps: often while vLLM creates its segments at
# start-up, then rarely (a late segment is still claimed before a crash can leave it behind).
WATCH_FAST_S, WATCH_FAST_FOR_S, WATCH_SLOW_S = TICK_S, 180.0, 5.0
# A scan reads the maps of every process of the tree (~13 ms of CPU with vLLM's libraries mapped:
# 0.7 s of the supervisor's CPU while vLLM started, taken from vLLM on a busy host), so the
# watcher scans only while unclaimed vLLM entries are new: this many times after the set of them
# last changed (a process maps an entry a moment after creating it).
SCANS_AFTER_CHANGE = 4


def is_vllm_shm(name: str) -> bool:
    return any(p.match(name) for p in SHM_PATTERNS)


def mapped_inodes(pid: int) -> set[tuple[int, int]]:
    """(st_dev, st_ino) of the files process `pid` maps.

    By inode, not by path, and so from /proc/PID/maps (psutil's memory_maps() has paths only):
    glibc's sem_open() maps a temporary `sem.XXXXXX`, links it to its final name and unlinks the
    temporary one, so the maps of every live semaphore name a deleted file."""
    used = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[4] != "0":
                major, minor = (int(x, 16) for x in parts[3].split(":"))
                used.add((os.makedev(major, minor), int(parts[4])))
    return used


def files_in_use(processes: Iterable[psutil.Process] | None = None) -> set[tuple[int, int]]:
    """(st_dev, st_ino) of every file the given (default: every visible) process maps or has open."""
    used: set[tuple[int, int]] = set()
    for proc in processes if processes is not None else psutil.process_iter():
        try:
            used |= mapped_inodes(proc.pid)
            for f in proc.open_files():
                try:
                    st = os.stat(f.path)
                    used.add((st.st_dev, st.st_ino))
                except OSError:
                    pass
        except (OSError, psutil.Error):
            continue
    return used


def vllm_entries(shm_dir: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in shm_dir.iterdir() if is_vllm_shm(p.name)) if shm_dir.is_dir() else []


def entries_used_by(shm_dir: pathlib.Path, used: set[tuple[int, int]]) -> set[str]:
    return {entry.name for entry in vllm_entries(shm_dir) if inode(entry) in used}


def tree_of(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


# ---------------------------------------------------------------------------------- locks


def _lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@contextlib.contextmanager
def locked_if_dead(path: pathlib.Path):
    """Yields an fd of `path` holding its lock if its owner is gone, else None (owner alive, or
    no such file). The lock is held until the block ends, so nobody else sweeps it meanwhile."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        yield fd if _lock(fd) else None
    finally:
        os.close(fd)


def create_locked(path: pathlib.Path, content: bytes = b"") -> int:
    """Create `path` already locked: written and locked under a temporary name, then renamed, so
    a concurrent sweep never finds it unlocked."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, content)
    os.rename(tmp, path)
    return fd


def read_claim(fd: int) -> dict:
    """A claim's content; {} if it is empty or was cut mid-write by a crash."""
    try:
        data = json.loads(os.pread(fd, 1 << 20, 0) or b"{}")
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


# ---------------------------------------------------------------------------------- a run's claim


def _rewrite(fd: int, data: dict) -> None:
    content = json.dumps(data).encode()
    os.pwrite(fd, content, 0)
    os.ftruncate(fd, len(content))


class Claim:
    """This run's claim on shm_dir entries, locked for the run's life."""

    def __init__(self, shm_dir: pathlib.Path, run_dir: pathlib.Path):
        self.path = shm_dir / f"{CLAIM_PREFIX}{uuid.uuid4().hex[:12]}{CLAIM_SUFFIX}"
        self.run_dir = run_dir
        self.names: set[str] = set()
        self.fd = create_locked(self.path, json.dumps(self._data()).encode())

    def _data(self) -> dict:
        return {"run_dir": str(self.run_dir), "shm": sorted(self.names)}

    def add(self, names: set[str]) -> None:
        if names <= self.names:
            return
        self.names |= names
        _rewrite(self.fd, self._data())

    def release(self) -> list[str]:
        """At exit, after every process of the run is gone: remove what it claimed, then the claim."""
        removed = remove([self.path.parent / n for n in sorted(self.names)])
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self.fd)
        return removed


class Watcher(threading.Thread):
    """Records in the claim the shm entries that the process tree of `pid` maps or has open."""

    def __init__(self, claim: Claim, shm_dir: pathlib.Path, pid: int):
        super().__init__(name="janitor", daemon=True)
        self.claim, self.shm_dir, self.pid = claim, shm_dir, pid
        self.stopped = threading.Event()

    def scan(self, unclaimed=None) -> None:
        """Claim the unclaimed vLLM entries the run's processes map (`unclaimed`: as just listed
        by `unclaimed()`, so that the directory is not listed twice)."""
        entries = self.unclaimed() if unclaimed is None else unclaimed
        used = files_in_use(tree_of(self.pid))
        self.claim.add({name for name, ino in entries if ino in used})

    def unclaimed(self) -> frozenset[tuple[str, tuple[int, int] | None]]:
        """The vLLM entries in the shm directory this run has not claimed, by name and inode."""
        return frozenset(
            (entry.name, inode(entry))
            for entry in vllm_entries(self.shm_dir)
            if entry.name not in self.claim.names
        )

    def run(self) -> None:
        waited, seen, scans_left = 0.0, frozenset(), 0
        while not self.stopped.is_set():
            with contextlib.suppress(OSError, psutil.Error):
                new = self.unclaimed()
                if new != seen:
                    seen, scans_left = new, SCANS_AFTER_CHANGE
                if new and scans_left > 0:
                    scans_left -= 1
                    self.scan(new)
            period = WATCH_FAST_S if waited < WATCH_FAST_FOR_S else WATCH_SLOW_S
            self.stopped.wait(period)
            waited += period

    def stop(self) -> None:
        self.stopped.set()
        if self.is_alive():
            self.join(timeout=5)


# ---------------------------------------------------------------------------------- the sweep


@dataclasses.dataclass
class Sweep:
    removed: list[str] = dataclasses.field(default_factory=list)  # a dead run's, gone now
    unclaimed: list[str] = dataclasses.field(default_factory=list)  # nobody's we can prove: kept


def sweep(
    shm_dir: pathlib.Path,
    tmp_dir: pathlib.Path,
    in_use: Callable[[], set[tuple[int, int]]] = files_in_use,
) -> Sweep:
    """Remove what dead runs claimed (shm entries no visible process maps, their run
    directories); report vLLM shm entries and run directories nobody's claim covers."""
    out = Sweep()
    claimed: set[str] = set()
    used: set[tuple[int, int]] | None = None
    claims = sorted(shm_dir.glob(f"{CLAIM_PREFIX}*{CLAIM_SUFFIX}")) if shm_dir.is_dir() else []
    for path in claims:
        with locked_if_dead(path) as fd:
            if fd is None:  # a live run (or gone since the listing)
                with contextlib.suppress(OSError):
                    with open(path, "rb") as f:
                        claimed |= set(read_claim(f.fileno()).get("shm", []))
                continue
            data = read_claim(fd)
            names = [n for n in data.get("shm", []) if is_vllm_shm(n)]
            claimed |= set(names)
            if used is None:
                used = in_use()
            present = [shm_dir / n for n in names if (shm_dir / n).exists()]
            busy = [p for p in present if inode(p) in used]
            out.removed += remove([p for p in present if p not in busy])
            if busy:  # a dying process still maps them: keep the claim for the next sweep
                _rewrite(fd, {**data, "shm": [p.name for p in busy]})
            else:
                out.removed += remove([path])
    for entry in vllm_entries(shm_dir):
        if entry.name not in claimed:
            out.unclaimed.append(str(entry))
    for run_dir in sorted(tmp_dir.glob(RUN_DIR_PREFIX + "*")):
        lock = run_dir / LOCK_FILE
        if not lock.exists():
            out.unclaimed.append(str(run_dir))
            continue
        with locked_if_dead(lock) as fd:
            if fd is not None:
                out.removed += remove([run_dir])
    return out


def inode(path: pathlib.Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
        return (st.st_dev, st.st_ino)
    except OSError:
        return None


def remove(paths: list[pathlib.Path]) -> list[str]:
    removed = []
    for path in paths:
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(str(path))
        except OSError:
            pass
    return removed


@dataclasses.dataclass
class Run:
    """What `run_dir` yields: the directory for vLLM's TMPDIR, and `watch(pid)` to start
    recording what vLLM's processes map."""

    path: pathlib.Path
    claim: Claim | None  # None without a shm_dir (nothing there to claim)
    shm_dir: pathlib.Path
    watcher: Watcher | None = None

    def watch(self, pid: int) -> None:
        if self.claim is not None:
            self.watcher = Watcher(self.claim, self.shm_dir, pid)
            self.watcher.start()


@contextlib.contextmanager
def run_dir(tmp_dir: pathlib.Path, shm_dir: pathlib.Path, state_path: pathlib.Path):
    """One run: sweeps dead runs' leftovers, makes and locks the run directory and the claim; on
    exit (every process of the run gone) removes what the run claimed, its directory and the
    state file."""
    found = sweep(shm_dir, tmp_dir)
    if found.removed:
        log(
            f"removed {len(found.removed)} stale leftover(s) of dead run(s): {' '.join(found.removed)}"
        )
    if found.unclaimed:
        log(
            f"left alone {len(found.unclaimed)} vLLM shm entr(ies) / run dir(s) that no run "
            f"claims (another server's, or unknown): {' '.join(found.unclaimed)}"
        )
    path = pathlib.Path(tempfile.mkdtemp(prefix=RUN_DIR_PREFIX, dir=tmp_dir))
    lock_fd = create_locked(path / LOCK_FILE)
    run = Run(path, Claim(shm_dir, path) if shm_dir.is_dir() else None, shm_dir)
    try:
        yield run
    finally:
        if run.watcher is not None:
            run.watcher.stop()
        if run.claim is not None:
            removed = run.claim.release()
            if removed:
                log(f"removed {len(removed)} shared memory leftover(s) of this run")
        shutil.rmtree(path, ignore_errors=True)
        os.close(lock_fd)
        remove([state_path])
