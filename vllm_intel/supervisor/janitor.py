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

Only what this user wrote is ever removed or rewritten: a claim or lock file is opened without
following a symlink and used only if it is a regular file of our euid, mode 0600 (what
`create_locked` makes); anything else under those names was planted or is another user's, and
is reported and left alone. A name that a live claim lists is never removed, whoever else lists
it, and the only directories ever removed recursively are run directories of ours.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import pathlib
import re
import stat
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable

import psutil

from .errors import ConfigError, load_json
from .extension import Extension
from .log import log
from .paths import DIR_FLAGS, RUN_DIR_PREFIX, shm_not_writable
from .timing import TICK_S

# Intel OpenMP's registration of each process that loads it (libiomp5: `__KMP_REGISTERED_LIB_<pid>_
# <uid>`, written and unmapped at once; removed by the library's exit handler, which neither a
# killed process nor fast-exit's os._exit runs): a run claims it by the pid in its name.
KMP_REGISTRATION = re.compile(r"__KMP_REGISTERED_LIB_([0-9]+)(_[0-9]+)?")
# Names vLLM (multiprocessing) gives its shared memory segments and semaphores in /dev/shm.
SHM_PATTERNS = (
    re.compile(r"psm_[0-9a-f]+"),
    re.compile(r"sem\.mp-\w+"),
    re.compile(r"wnsm_\w+"),
    re.compile(r"vllm_intel_wake_[0-9a-f]+"),  # patch shm-busy-sleep's futex words
    # the CPU communicator's segments under TP/PP (vllm/distributed/device_communicators/
    # cpu_communicator.py: VLLM_DIST_IDENT, the basename of the run's file:// init method, then
    # the group and its ranks; the C++ side adds _<rank>): `vllm_dist_<hex>-tp:0-[0-1]-cpushm_0`
    re.compile(r"vllm_dist_[0-9a-f]+-[\w:.\[\]-]+-cpushm_[0-9]+"),
    KMP_REGISTRATION,
)
CLAIM_PREFIX, CLAIM_SUFFIX = "vllm-intel-run-", ".claim"
LOCK_FILE = "supervisor.lock"
# How often the watcher records what the run maps: often while vLLM creates its segments at
# start-up, then rarely (a late segment is still claimed before a crash can leave it behind).
WATCH_FAST_S, WATCH_FAST_FOR_S, WATCH_SLOW_S = TICK_S, 180.0, 5.0
# A scan reads the maps of every process of the tree, costly with vLLM's libraries mapped (CPU
# taken from vLLM's own start: docs/bench.md, "overhead"), so the watcher scans only while
# unclaimed vLLM entries are new: this many times after the set of them last changed (a process
# maps an entry a moment after creating it).
SCANS_AFTER_CHANGE = 4


def is_vllm_shm(name: str) -> bool:
    # fullmatch: `$` would also accept a name ending in a newline
    return any(p.fullmatch(name) for p in SHM_PATTERNS)


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
    """The vLLM entries in shm_dir; none in one we may not list (another user's)."""
    try:
        return sorted(p for p in shm_dir.iterdir() if is_vllm_shm(p.name))
    except OSError:
        return []


def registered_by(name: str, pids: set[str]) -> bool:
    """An Intel OpenMP registration of one of `pids` (its name holds the process's pid)."""
    m = KMP_REGISTRATION.fullmatch(name)
    return m is not None and m.group(1) in pids


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


def is_ours(st: os.stat_result) -> bool:
    """A file `create_locked` made for this user: regular, our euid, mode 0600."""
    return (
        stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600
    )


def open_own(path: pathlib.Path, flags: int = os.O_RDWR) -> int | None:
    """An fd of `path` if it is a file of ours (see is_ours), else None. Never through a
    symlink, and never opening a FIFO or device someone planted under the name."""
    try:
        if not is_ours(os.lstat(path)):
            return None
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if is_ours(os.fstat(fd)):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def create_locked(path: pathlib.Path, content: bytes = b"", dir_fd: int | None = None) -> int:
    """Create `path` (a name in directory `dir_fd` if given) already locked: written and locked
    under a temporary name, then renamed, so a concurrent sweep never finds it unlocked. On
    failure (a full or read-only file system) nothing is left."""
    tmp = str(path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}"))
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask: a sweep trusts only mode 0600 (is_ours)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, content)
        os.rename(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    return fd


def read_claim(fd: int) -> dict:
    """A claim's content; {} if it is empty or was cut mid-write by a crash."""
    try:
        data = load_json(os.pread(fd, 1 << 20, 0) or b"{}")
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


class Watcher:
    """Records in the claim the shm entries that the process tree of `pid` maps or has open.
    No thread of its own: the supervisor's loop calls `tick()` on every turn."""

    def __init__(self, claim: Claim, shm_dir: pathlib.Path, pid: int):
        self.claim, self.shm_dir, self.pid = claim, shm_dir, pid
        self.started = self.next_at = time.monotonic()
        self.seen: frozenset = frozenset()
        self.scans_left = 0

    def scan(self, unclaimed=None) -> None:
        """Claim the unclaimed vLLM entries the run's processes map (`unclaimed`: as just listed
        by `unclaimed()`, so that the directory is not listed twice)."""
        entries = self.unclaimed() if unclaimed is None else unclaimed
        tree = tree_of(self.pid)
        used, pids = files_in_use(tree), {str(p.pid) for p in tree}
        self.claim.add({name for name, ino in entries if ino in used or registered_by(name, pids)})

    def unclaimed(self) -> frozenset[tuple[str, tuple[int, int] | None]]:
        """The vLLM entries in the shm directory this run has not claimed, by name and inode."""
        return frozenset(
            (entry.name, inode(entry))
            for entry in vllm_entries(self.shm_dir)
            if entry.name not in self.claim.names
        )

    def tick(self, now: float | None = None) -> None:
        """Scan when due: every WATCH_FAST_S for WATCH_FAST_FOR_S (vLLM creates its segments
        while it starts), then every WATCH_SLOW_S; the maps are read only while the unclaimed
        entries have changed in the last SCANS_AFTER_CHANGE looks (a scan reads every process's
        maps; another server's entries, never mapped here, stop being scanned)."""
        now = time.monotonic() if now is None else now
        if now < self.next_at:
            return
        with contextlib.suppress(OSError, psutil.Error):
            new = self.unclaimed()
            if new != self.seen:
                self.seen, self.scans_left = new, SCANS_AFTER_CHANGE
            if new and self.scans_left > 0:
                self.scans_left -= 1
                self.scan(new)
        fast = now - self.started < WATCH_FAST_FOR_S
        self.next_at = now + (WATCH_FAST_S if fast else WATCH_SLOW_S)


# ---------------------------------------------------------------------------------- the sweep


@dataclasses.dataclass
class Sweep:
    removed: list[str] = dataclasses.field(default_factory=list)  # a dead run's, gone now
    unclaimed: list[str] = dataclasses.field(default_factory=list)  # nobody's we can prove: kept
    foreign: list[str] = dataclasses.field(default_factory=list)  # not this user's to act on: kept


def claim_names(data: dict) -> list[str]:
    """The vLLM entry names a claim lists; anything else in it (a forged or foreign claim's
    content) is ignored."""
    names = data.get("shm", [])
    if not isinstance(names, list):
        return []
    return [n for n in names if isinstance(n, str) and is_vllm_shm(n)]


def read_claim_at(path: pathlib.Path) -> dict:
    """The content of a claim we do not act on, read-only and not through a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        return read_claim(fd) if stat.S_ISREG(os.fstat(fd).st_mode) else {}
    finally:
        os.close(fd)


def owned(path: pathlib.Path) -> bool:
    """`path` exists and is this user's: what our own run created, not a name reused since."""
    try:
        return os.lstat(path).st_uid == os.geteuid()
    except OSError:
        return False


def is_foreign(path: pathlib.Path) -> bool:
    """`path` exists and is not a file of ours (gone since the listing: not foreign)."""
    try:
        return not is_ours(os.lstat(path))
    except FileNotFoundError:
        return False
    except OSError:
        return True


def take_dead_claims(claims: list[pathlib.Path], out: Sweep, stack: contextlib.ExitStack):
    """Locks every dead claim of ours (unlocked when `stack` closes): their (path, fd), and the
    names every other claim lists. Those are kept even when a dead claim lists them too: a live
    run may map them, and a claim we may not act on proves nothing dead."""
    dead, kept = [], set()
    for path in claims:
        fd = open_own(path)
        if fd is None:
            if is_foreign(path):
                out.foreign.append(str(path))
            kept |= set(claim_names(read_claim_at(path)))
            continue
        stack.callback(os.close, fd)
        if _lock(fd):
            dead.append((path, fd))
        else:  # a live run
            kept |= set(claim_names(read_claim(fd)))
    return dead, kept


def sweep_claims(shm_dir: pathlib.Path, out: Sweep, in_use) -> set[str]:
    """Remove what dead runs of ours claimed and no visible process maps; the names any claim
    lists."""
    claims = sorted(shm_dir.glob(f"{CLAIM_PREFIX}*{CLAIM_SUFFIX}")) if shm_dir.is_dir() else []
    used: set[tuple[int, int]] | None = None
    with contextlib.ExitStack() as stack:
        dead, kept = take_dead_claims(claims, out, stack)
        claimed = set(kept)
        for path, fd in dead:
            data = read_claim(fd)
            names = claim_names(data)
            claimed |= set(names)
            if used is None:
                used = in_use()
            present = [shm_dir / n for n in names if n not in kept and owned(shm_dir / n)]
            busy = [p for p in present if inode(p) in used]
            out.removed += remove([p for p in present if p not in busy])
            if busy:  # a dying process still maps them: keep the claim for the next sweep
                _rewrite(fd, {**data, "shm": [p.name for p in busy]})
            else:
                out.removed += remove([path])
    return claimed


def sweep_run_dir(run_dir: pathlib.Path, out: Sweep) -> None:
    """Remove `run_dir` if it is a directory of ours whose lock is free. Another user's (which
    we may not even be able to look into), or a symlink, is reported and left alone."""
    try:
        st = os.lstat(run_dir)
    except FileNotFoundError:
        return
    except OSError:
        st = None
    if st is None or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        out.foreign.append(str(run_dir))
        return
    lock = run_dir / LOCK_FILE
    fd = open_own(lock)
    if fd is None:  # no lock file: a run we cannot prove dead; anything else there is not ours
        (out.foreign if is_foreign(lock) else out.unclaimed).append(str(run_dir))
        return
    try:
        if _lock(fd) and remove_tree(run_dir):  # the lock held: nobody else sweeps it meanwhile
            out.removed.append(str(run_dir))
    finally:
        os.close(fd)


def sweep(
    shm_dir: pathlib.Path,
    tmp_dir: pathlib.Path,
    in_use: Callable[[], set[tuple[int, int]]] = files_in_use,
) -> Sweep:
    """Remove what dead runs claimed (shm entries no visible process maps, their run
    directories); report vLLM shm entries and run directories nobody's claim covers, and claims
    and run directories that are not ours to act on."""
    out = Sweep()
    claimed = sweep_claims(shm_dir, out, in_use)
    for entry in vllm_entries(shm_dir):
        if entry.name not in claimed:
            out.unclaimed.append(str(entry))
    for run_dir in sorted(tmp_dir.glob(RUN_DIR_PREFIX + "*")):
        sweep_run_dir(run_dir, out)
    return out


def inode(path: pathlib.Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
        return (st.st_dev, st.st_ino)
    except OSError:
        return None


def remove(paths: list[pathlib.Path]) -> list[str]:
    """Unlink each of `paths`: never recursively (unlink fails on a directory), so a name that
    turns out to be a directory is left alone."""
    removed = []
    for path in paths:
        try:
            path.unlink()
            removed.append(str(path))
        except OSError:
            pass
    return removed


MOUNTINFO = pathlib.Path("/proc/self/mountinfo")


def mount_points(mountinfo: pathlib.Path = MOUNTINFO) -> set[str]:
    """Every mount point of this mount namespace (a bind mount of a directory of the same file
    system has the same st_dev: only this list shows it)."""
    try:
        text = mountinfo.read_text()
    except OSError:
        return set()
    found = set()
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) > 4:  # octal escapes: \040 for a blank, \134 for a backslash
            found.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4]))
    return found


def remove_tree(path: pathlib.Path, mounts: set[str] | None = None) -> bool:
    """remove_dir of the directory at `path`, never through a symlink there. True when it is gone."""
    try:
        fd = os.open(path, DIR_FLAGS | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        return remove_dir(fd, path, mounts)
    finally:
        os.close(fd)


def remove_dir(fd: int, path: pathlib.Path, mounts: set[str] | None = None) -> bool:
    """rm -r --one-file-system of directory `fd`, ours, through directory fds (nothing swapped
    for a symlink meanwhile is followed), then rmdir of `path` if that is still this directory.
    Never enters a mount point (a bind mount: the user's files), another file system, a
    symlink, or a directory another user owns: those are left, and so their parents. True when
    the directory is gone."""
    mounts = mount_points() if mounts is None else mounts
    try:
        st = os.fstat(fd)
        where = os.readlink(f"/proc/self/fd/{fd}")  # where it is now, as mountinfo names it
        if st.st_uid != os.geteuid() or where in mounts:
            return False
        if not _empty_dir(fd, where, st.st_dev, mounts):
            return False
        now = os.lstat(path)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False  # moved away: emptied, and what `path` names now is not ours
        os.rmdir(path)
        return True
    except OSError:  # EMFILE, EIO, ...: what is left is a dead run's, the next start sweeps it
        return False


def _empty_dir(fd: int, where: str, dev: int, mounts: set[str]) -> bool:
    """Remove what directory `fd` (at `where`) holds (see remove_tree); True when it is empty."""
    empty = True
    for entry in list(os.scandir(fd)):
        name = entry.name
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=fd)
                continue
            inner = f"{where}/{name}"
            if st.st_dev != dev or st.st_uid != os.geteuid() or inner in mounts:
                empty = False
                continue
            sub = os.open(
                name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
            try:
                same = (os.fstat(sub).st_dev, os.fstat(sub).st_ino) == (st.st_dev, st.st_ino)
                done = same and _empty_dir(sub, inner, dev, mounts)
            finally:
                os.close(sub)
            if done:
                os.rmdir(name, dir_fd=fd)
            else:
                empty = False
        except OSError:
            empty = False
    return empty


@dataclasses.dataclass
class Run(Extension):
    """What `run_dir` yields: the directory for vLLM's TMPDIR; beside the loop, the record of
    what vLLM's processes map in shm (its claim)."""

    path: pathlib.Path
    claim: Claim | None  # None without a shm_dir (nothing there to claim)
    shm_dir: pathlib.Path
    watcher: Watcher | None = None
    swept: int = 0  # dead runs' entries the sweep before this run removed

    def on_spawn(self, sup) -> None:
        if self.claim is not None:
            self.watcher = Watcher(self.claim, self.shm_dir, sup.child.pid)

    def on_tick(self, sup) -> None:
        if self.watcher is not None:
            self.watcher.tick()  # a few stat()s; the maps only while new entries appear


@contextlib.contextmanager
def run_dir(
    tmp_dir: pathlib.Path, shm_dir: pathlib.Path, preflight: Callable[[], None] | None = None
):
    """One run: sweeps dead runs' leftovers, runs `preflight` (the caller's checks, with dead
    runs' leftovers gone), makes and locks the run directory and the claim; on exit (every
    process of the run gone) removes what the run claimed and its directory. The directory is
    reached through its fd, opened here: it, or TMPDIR, swapped for a symlink meanwhile redirects
    no write of ours and no removal. ConfigError when shm_dir cannot be written: nothing is left
    then."""
    found = sweep(shm_dir, tmp_dir)
    report(found)
    if preflight is not None:
        preflight()
    path, fd = make_run_dir(tmp_dir)
    lock_fd = None
    try:
        lock_fd = create_locked(pathlib.Path(LOCK_FILE), dir_fd=fd)
        run = Run(path, claim_in(shm_dir, path), shm_dir)
        run.swept = len(found.removed)
        try:
            yield run
        finally:
            if run.claim is not None:
                removed = run.claim.release()
                if removed:
                    log(f"removed {len(removed)} shared memory leftover(s) of this run")
    finally:
        # made here, so it is ours; nothing mounted in it or not ours is entered.
        remove_dir(fd, path)
        if lock_fd is not None:
            os.close(lock_fd)
        os.close(fd)


def make_run_dir(tmp_dir: pathlib.Path) -> tuple[pathlib.Path, int]:
    """A new run directory (mode 0700) in tmp_dir, and its fd."""
    path = pathlib.Path(tempfile.mkdtemp(prefix=RUN_DIR_PREFIX, dir=tmp_dir))
    try:
        return path, os.open(path, DIR_FLAGS | os.O_NOFOLLOW)
    except OSError:
        os.rmdir(path)
        raise


def claim_in(shm_dir: pathlib.Path, run_dir: pathlib.Path) -> Claim | None:
    """The run's claim in shm_dir; None without a shm_dir (nothing there to claim). ConfigError
    when it cannot be written (read-only, full, another user's): vLLM could not either."""
    if not shm_dir.is_dir():
        return None
    try:
        return Claim(shm_dir, run_dir)
    except OSError as e:
        raise ConfigError(shm_not_writable(shm_dir, e)) from None


def report(found: Sweep) -> None:
    if found.removed:
        log(
            f"removed {len(found.removed)} stale leftover(s) of dead run(s): {' '.join(found.removed)}"
        )
    if found.unclaimed:
        log(
            f"left alone {len(found.unclaimed)} vLLM shm entr(ies) / run dir(s) that no run "
            f"claims (another server's, or unknown): {' '.join(found.unclaimed)}"
        )
    if found.foreign:
        log(
            f"left alone {len(found.foreign)} claim(s) / run dir(s) that are not this user's "
            f"files (another user's, a symlink, or not mode 0600): {' '.join(found.foreign)}"
        )
