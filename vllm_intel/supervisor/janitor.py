"""The janitor: vLLM shared memory segments and our run directories that nothing uses any more.

Decisions are pure functions of what is on disk and of two injectable views of the processes
(`in_use`, `identity`), so the unit tests run them against a fake process table.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable

import psutil

from .settings import RUN_DIR_PREFIX, log

# Names vLLM (multiprocessing) gives its shared memory segments and semaphores in /dev/shm.
SHM_PATTERNS = (
    re.compile(r"^psm_[0-9a-f]+$"),
    re.compile(r"^sem\.mp-\w+$"),
    re.compile(r"^wnsm_\w+$"),
)
PID_FILE = "supervisor.pid"


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
    """(st_dev, st_ino) of every file some live process has mapped or open."""
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


def process_identity(pid: int) -> str:
    """ "PID STARTTIME": tells a live process from a later one that reuses its pid (in a restarted
    container the supervisor is PID 1 every time)."""
    return f"{pid} {psutil.Process(pid).create_time():.2f}"


def _alive(identity: Callable[[int], str], recorded: str) -> bool:
    pid_s, _, _ = recorded.partition(" ")
    try:
        return identity(int(pid_s)) == recorded
    except (OSError, ValueError, psutil.Error):
        return False  # no such process, or no readable pid: stale


def stale(
    shm_dir: pathlib.Path,
    tmp_dir: pathlib.Path,
    only: set[str] | None = None,
    *,
    in_use: Callable[[], set[tuple[int, int]]] = files_in_use,
    identity: Callable[[int], str] = process_identity,
) -> list[pathlib.Path]:
    """vLLM shm segments and run directories that no live process uses (nothing is removed).

    `only` limits the shm candidates (at exit: the segments created during this run) and skips
    the run directories."""
    # List first, then look at what is in use: a segment or semaphore is mapped (or open) before
    # its name appears, so one created between the two steps is never taken for stale.
    candidates = [
        entry
        for entry in (sorted(shm_dir.iterdir()) if shm_dir.is_dir() else [])
        if (only is None or entry.name in only) and any(p.match(entry.name) for p in SHM_PATTERNS)
    ]
    used = in_use() if candidates else set()  # no candidate: no need to read every process
    found = []
    for entry in candidates:
        try:
            st = entry.stat()
        except OSError:
            continue
        if (st.st_dev, st.st_ino) not in used:
            found.append(entry)
    for run_dir in sorted(tmp_dir.glob(RUN_DIR_PREFIX + "*")) if only is None else []:
        try:
            recorded = (run_dir / PID_FILE).read_text()
        except OSError:
            recorded = ""
        if not _alive(identity, recorded):
            found.append(run_dir)
    return found


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


def sweep(shm_dir: pathlib.Path, tmp_dir: pathlib.Path, only: set[str] | None = None) -> list[str]:
    return remove(stale(shm_dir, tmp_dir, only))


def shm_names(shm_dir: pathlib.Path) -> set[str]:
    return set(os.listdir(shm_dir)) if shm_dir.is_dir() else set()


@contextlib.contextmanager
def run_dir(tmp_dir: pathlib.Path, shm_dir: pathlib.Path, state_path: pathlib.Path):
    """One run's directory (TMPDIR of vLLM). On entry, sweeps a crashed earlier run's leftovers;
    on exit, removes the directory, the state file and the segments this run left in shm_dir."""
    removed = sweep(shm_dir, tmp_dir)
    if removed:
        log(f"removed {len(removed)} stale leftover(s) of an earlier run: {' '.join(removed)}")
    path = pathlib.Path(tempfile.mkdtemp(prefix=RUN_DIR_PREFIX, dir=tmp_dir))
    (path / PID_FILE).write_text(process_identity(os.getpid()))
    before = shm_names(shm_dir)
    try:
        yield path
    finally:
        removed = sweep(shm_dir, tmp_dir, only=shm_names(shm_dir) - before)
        if removed:
            log(f"removed {len(removed)} shared memory leftover(s) of this run")
        shutil.rmtree(path, ignore_errors=True)
        remove([state_path])
