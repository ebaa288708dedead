"""Every path the supervisor reads or writes outside vLLM's own: the state file and its private
directory, TMPDIR, /dev/shm, the model path, the caches. What is not ours is refused before
anything starts, so that nothing of the user's is ever replaced or removed.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import stat
import tempfile
import uuid
import weakref

from .errors import ConfigError, load_json, shown

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILTIN_MODELS = (
    pathlib.Path("/opt/vllm-intel/models/tiny-llama"),  # inside the images
    ROOT / "build" / "tiny-llama",  # a checkout after `make setup`
)
RUN_DIR_PREFIX = "vllm-intel-run-"
# vLLM binds ZeroMQ ipc sockets named by a uuid in the run dir; a unix socket path has 107 bytes.
MAX_TMPDIR_LEN = 107 - len(RUN_DIR_PREFIX) - 8 - 2 - 36
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def state_file(port: int, env=os.environ) -> pathlib.Path:
    explicit = env.get("INTEL_VLLM_STATE_FILE")
    if explicit:
        return pathlib.Path(explicit)
    return private_dir() / f"vllm-intel-{port}.state.json"


def private_dir() -> pathlib.Path:
    """The default state file's directory: this user's own in TMPDIR (a shared /tmp on a bare
    host: nobody else can plant or replace anything in it; `probe`, run as the same user, finds
    it by the same name)."""
    return pathlib.Path(tempfile.gettempdir()) / f"vllm-intel-{os.geteuid()}"


def make_private_dir(path: pathlib.Path) -> None:
    """Create `path` 0700, or accept it only as this user's private directory. Raises ConfigError."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot make {path}: {e.strerror or e}") from None
    if not is_private_dir(path):
        raise ConfigError(
            f"{path} is not this user's private directory (another user's, a symlink, or not "
            "mode 0700): remove it, or set INTEL_VLLM_STATE_FILE or TMPDIR"
        )


def is_private_dir(path: pathlib.Path) -> bool:
    """`path` is a directory (not a symlink) of this user that nobody else can write or read:
    what make_private_dir makes. `probe` reads a state file only in such a directory (another
    user can plant `vllm-intel-<uid>` in a shared /tmp first)."""
    try:
        return is_private(os.lstat(path))
    except OSError:
        return False


def is_private(st: os.stat_result) -> bool:
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def open_state_dir(path: pathlib.Path) -> int:
    """An fd of the state file's directory, opened once at start: every write and the unlink at
    exit go through it, so a directory swapped for a symlink meanwhile redirects neither. The
    default one only as this user's private directory and never through a symlink; a given one
    (INTEL_VLLM_STATE_FILE, made by check_state_file) through the links its path holds. Raises
    ConfigError."""
    private = path == private_dir()
    try:
        fd = os.open(path, DIR_FLAGS | (os.O_NOFOLLOW if private else 0))
    except OSError as e:
        raise ConfigError(
            f"cannot open the state file's directory {path}: {e.strerror or e}"
        ) from None
    if private and not is_private(os.fstat(fd)):
        os.close(fd)
        raise ConfigError(f"{path} is not this user's private directory")
    return fd


def shm_not_writable(shm_dir: pathlib.Path, e: OSError) -> str:
    """The one line for a shared-memory directory the run cannot write (read-only, full,
    another user's): vLLM's message queues and workers need one of the container's own."""
    return (
        f"{shm_dir} cannot be written ({e.strerror or e}): vLLM keeps its message queues there; "
        "give the container a writable one of its own: docker run --shm-size=1g (compose: "
        "shm_size: 1g; Kubernetes: an emptyDir with medium: Memory mounted at /dev/shm)"
    )


STATE_KEYS = frozenset({"state", "pid", "port", "url", "child", "drain"})  # loop.write_state's


def stale_state_file(path: pathlib.Path, st: os.stat_result) -> bool:
    """An existing file at `path` that a supervisor of this user wrote (mode 0600, its keys) and
    whose supervisor is gone (or was this process's pid: a restarted container's PID 1). Only
    such a file may be replaced: anything else is the user's."""
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o600 or st.st_size > 4096:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            data = load_json(f.read(4096))
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or set(data) != STATE_KEYS or type(data["pid"]) is not int:
        return False
    pid = data["pid"]
    if pid == os.getpid() or not 0 < pid < 2**31:
        return pid == os.getpid()
    try:
        os.kill(pid, 0)
        return False  # its supervisor still runs: two servers must not share one state file
    except ProcessLookupError:
        return True
    except OSError:
        return False


def check_state_file(path: pathlib.Path) -> pathlib.Path:
    """Preflight: `path` can be the state file, a regular file the supervisor replaces while it
    runs and removes at exit. Anything else there (a directory, a symlink, `/`) is the user's:
    refused before anything starts, so that nothing of theirs is ever replaced or removed."""
    if path.parent == private_dir():
        make_private_dir(path.parent)
    why = state_file_problem(path)
    if why:
        raise ConfigError(f"INTEL_VLLM_STATE_FILE {path}: {why}")
    try:  # here: one that cannot be made is one line, not a probe that never finds the file
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"INTEL_VLLM_STATE_FILE {path}: cannot make its directory ({e.strerror or e})"
        ) from None
    return path


def state_file_problem(path: pathlib.Path) -> str | None:
    if path.name in ("", ".", ".."):
        return "names a directory, not a file"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        return f"is {kind}; it must name a file the supervisor may replace and remove"
    if st is not None and not stale_state_file(path, st):
        return (
            "is an existing file, not the state file of a stopped supervisor of this user: "
            "the supervisor creates it and removes it at exit; name a path that does not exist"
        )
    # The parent is created if missing; what exists of it must be directories.
    parent = next((p for p in path.parents if os.path.lexists(p)), None)
    if parent is not None and not parent.is_dir():
        return f"{parent} is not a directory"
    return None


def shm_dir(env=os.environ) -> pathlib.Path:
    return pathlib.Path(env.get("INTEL_VLLM_SHM_DIR", "/dev/shm"))


def looks_like_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~"))


def user_path(what: str, name: str) -> pathlib.Path:
    """pathlib.Path(name).expanduser(), or ConfigError (`~nosuchuser/...`: no such user)."""
    try:
        return pathlib.Path(name).expanduser()
    except RuntimeError:  # pathlib: "Could not determine home directory."
        user = name[1:].split("/", 1)[0]
        raise ConfigError(
            f"{what} {shown(name, 200, quote=False)}: no home directory for "
            + (f"user {shown(user)}" if user else "the current user (HOME unset)")
        ) from None


def path_exists(what: str, path: pathlib.Path) -> bool:
    """path.exists(), or ConfigError where the answer is an error (a too long name, EACCES)."""
    try:
        os.stat(path)
        return True
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        raise ConfigError(
            f"{what} {shown(str(path), 200, quote=False)}: {e.strerror or e}"
        ) from None
    except ValueError as e:  # an embedded NUL byte
        raise ConfigError(f"{what} {shown(str(path), 200, quote=False)}: {e}") from None


def check_model_path(name: str) -> None:
    """A model that looks like a path must exist. Raises ConfigError."""
    if looks_like_path(name) and not path_exists("model path", user_path("model path", name)):
        raise ConfigError(f"model path {shown(name, 200, quote=False)} does not exist")


def check_tmpdir(env=os.environ) -> None:
    """TMPDIR, when set, is a writable directory (Python's tempfile would silently use /tmp
    instead) short enough for vLLM's IPC socket paths. Raises ConfigError."""
    given = env.get("TMPDIR")
    if given:
        if not os.path.isdir(given):
            why = "does not exist" if not os.path.lexists(given) else "is not a directory"
            raise ConfigError(f"TMPDIR {shown(given, 200, quote=False)} {why}")
        try:  # as tempfile.gettempdir() tries it (a read-only mount refuses root too)
            with tempfile.TemporaryFile(dir=given):
                pass
        except OSError as e:
            raise ConfigError(
                f"TMPDIR {shown(given, 200, quote=False)} is not writable ({e.strerror or e})"
            ) from None
    tmp = tempfile.gettempdir()
    if len(tmp) > MAX_TMPDIR_LEN:
        raise ConfigError(
            f"TMPDIR {tmp} is longer than {MAX_TMPDIR_LEN} characters: vLLM's IPC "
            "socket paths inside it would not fit a unix socket address"
        )


def cache_home(env=os.environ) -> pathlib.Path:
    """$XDG_CACHE_HOME, else ~/.cache: where vLLM, torch and we keep caches."""
    return pathlib.Path(env.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")


def inductor_cache(env=os.environ) -> pathlib.Path:
    """TORCHINDUCTOR_CACHE_DIR for vLLM: compiled kernels kept across runs, outside the run dir."""
    return cache_home(env) / "vllm-intel" / "torchinductor"


class StateFile:
    """The state file, reached through its directory's fd alone (open_state_dir, opened here,
    once): a directory swapped for a symlink while the server runs redirects neither a
    write nor the unlink at exit to what the link points at."""

    def __init__(self, path: pathlib.Path):
        self.path = path  # for messages
        self.dir_fd = open_state_dir(path.parent)
        weakref.finalize(self, os.close, self.dir_fd)
        self.written: tuple[int, int, int] | None = None  # what identifies our last write

    def write(self, content: bytes) -> None:
        """Replace the file by a new mode-0600 one holding `content`. Written under a new name
        (O_EXCL: never through a planted symlink), then renamed over the state file's name,
        which replaces a symlink there instead of following it."""
        tmp = f".{self.path.name}.{uuid.uuid4().hex[:8]}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600, dir_fd=self.dir_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(content)
                f.flush()
                os.replace(tmp, self.path.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
                st = os.fstat(f.fileno())  # after the rename, which changes its ctime
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.dir_fd)
            raise
        self.written = (st.st_dev, st.st_ino, st.st_ctime_ns)

    def remove(self) -> bool:
        """Unlink the file only if it is still the regular file we wrote last: a user may have put
        something of their own there since. The ctime too, as an inode number is reused once its
        file is gone."""
        if self.written is None:
            return False
        try:
            st = os.stat(self.path.name, dir_fd=self.dir_fd, follow_symlinks=False)
            same = (st.st_dev, st.st_ino, st.st_ctime_ns) == self.written
            if not (stat.S_ISREG(st.st_mode) and same):
                return False
            os.unlink(self.path.name, dir_fd=self.dir_fd)
            return True
        except OSError:
            return False
