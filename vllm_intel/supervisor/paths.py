"""Every path the supervisor reads or writes outside vLLM's own: the state file and its private
directory, TMPDIR, /dev/shm, the model path, the caches. What is not ours is refused before
anything starts, so that nothing of the user's is ever replaced or removed.
"""

from __future__ import annotations

import os
import pathlib
import stat
import tempfile

from .errors import ConfigError, shown

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILTIN_MODELS = (
    pathlib.Path("/opt/vllm-intel/models/tiny-llama"),  # inside the images
    ROOT / "build" / "tiny-llama",  # a checkout after `make setup`
)
RUN_DIR_PREFIX = "vllm-intel-run-"
# vLLM binds ZeroMQ ipc sockets named by a uuid in the run dir; a unix socket path has 107 bytes.
MAX_TMPDIR_LEN = 107 - len(RUN_DIR_PREFIX) - 8 - 2 - 36


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
        st = os.lstat(path)
    except OSError as e:
        raise ConfigError(f"cannot make {path}: {e.strerror or e}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ConfigError(
            f"{path} is not this user's private directory (another user's, a symlink, or not "
            "mode 0700): remove it, or set INTEL_VLLM_STATE_FILE or TMPDIR"
        )


def check_state_file(path: pathlib.Path) -> pathlib.Path:
    """Preflight: `path` can be the state file, a regular file the supervisor replaces while it
    runs and removes at exit. Anything else there (a directory, a symlink, `/`) is the user's:
    refused before anything starts, so that nothing of theirs is ever replaced or removed."""
    if path.parent == private_dir():
        make_private_dir(path.parent)
    why = state_file_problem(path)
    if why:
        raise ConfigError(f"INTEL_VLLM_STATE_FILE {path}: {why}")
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
