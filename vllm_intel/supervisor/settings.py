"""Every input and every constant of the supervisor: flags, environment, drain, grace, timings,
exit codes. The docs (README, docs/CONVENTIONS.md, `entrypoint.py --help`) are rendered from the
tables here (vllm_intel.supervisor.docs) and a test checks they match.
"""

from __future__ import annotations

import enum
import os
import pathlib
import re
import stat
import sys
import tempfile
from dataclasses import dataclass

# ---------------------------------------------------------------------------------- timing

# Fits answers of up to ~1000 tokens in flight at SIGTERM at ~12 tokens/s per stream (4 streams of
# a 0.5 B model on 2 cores); an idle stop does not wait for it (docs/bench.md, drain-real).
DEFAULT_DRAIN_S = 90
XPU_MIN_DRAIN_S = 5
TEARDOWN_S = 10  # vLLM stops its engine core and workers after the drain
MARGIN_S = 5  # the orchestrator's slack after our own deadline
KILL_GRACE_S = 3  # the group gets SIGTERM this long before the SIGKILL
ORPHAN_GRACE_S = 2  # after the API server exits, before what is left of its group is SIGKILLed
TICK_S = 0.5  # the loop's wait; also the observer's poll period
HEALTH_TIMEOUT_S = 2.0  # a loaded host can take over a second to answer /health while starting
METRICS_TIMEOUT_S = 1.0
PROBE_TIMEOUT_S = 2.0
DEFAULT_PORT = 8000
# Bounds on inputs: a value past them is refused (exit 64) before anything starts.
MAX_DRAIN_S = 86400  # one day: a longer drain is a typo, and grace-period must print a sane number
MAX_CONFIG_BYTES = 1 << 20  # a --config file is a few vLLM flags, never megabytes
MAX_PARALLEL = 1024  # --tensor-parallel-size, --pipeline-parallel-size and their product
MAX_DIGITS = 12  # longer numbers are refused before int() (Python refuses > 4300 digits itself)


def grace_period(drain: int) -> int:
    """What compose stop_grace_period / Kubernetes terminationGracePeriodSeconds must allow."""
    return drain + TEARDOWN_S + MARGIN_S


def deadline(drain: int) -> int:
    """Seconds after the first SIGTERM at which the process group is SIGKILLed."""
    return drain + TEARDOWN_S


PRESTOP_S = 5  # deploy/k8s: the preStop sleep before kubelet's SIGTERM (tests/deploy checks it)

ORCHESTRATOR_FORMULA = f"""\
grace = DRAIN + TEARDOWN ({TEARDOWN_S} s) + MARGIN ({MARGIN_S} s)          `entrypoint.py grace-period` prints it
compose stop_grace_period             = grace                        ({grace_period(DEFAULT_DRAIN_S)} s by default)
Kubernetes terminationGracePeriodSeconds = preStop sleep + grace     ({PRESTOP_S} + {grace_period(DEFAULT_DRAIN_S)} = {PRESTOP_S + grace_period(DEFAULT_DRAIN_S)} s by default)"""

# ---------------------------------------------------------------------------------- exit codes


class Exit(enum.IntEnum):
    CONFIG = 64
    NO_DEVICE = 65
    PREFETCH = 69  # EX_UNAVAILABLE: the hub could not give us the model
    UNEXPECTED = 70
    FORCED = 124
    CANNOT_EXEC = 126
    NOT_FOUND = 127


SHUTDOWN_FORMULA = f"""\
DRAIN    = vLLM's --shutdown-timeout if you give it (command line, else --config file),
           else INTEL_VLLM_DRAIN_TIMEOUT                           default {DEFAULT_DRAIN_S} s
deadline = DRAIN + TEARDOWN ({TEARDOWN_S} s) after the first SIGTERM: the process group is SIGTERMed {KILL_GRACE_S} s
           before it and SIGKILLed at it; the entrypoint then exits {Exit.FORCED.value}
grace    = DRAIN + TEARDOWN + MARGIN ({MARGIN_S} s) = {grace_period(DEFAULT_DRAIN_S)} s by default"""

# (code, meaning): the table every doc shows.
EXIT_CODES = (
    ("vLLM's own", "vLLM exited after a stop request: `0` after a clean drain"),
    ("128+N", "vLLM died of signal N"),
    (
        str(Exit.CONFIG.value),
        "configuration error, nothing started (bad drain value or one above "
        f"{MAX_DRAIN_S} s, missing or unreadable model "
        "path, bad or unreadable `--config` file (not a regular file, over "
        f"{MAX_CONFIG_BYTES >> 20} MiB, not UTF-8, YAML aliases), a vLLM setting the "
        "supervisor cannot work with (a port outside 1-65535, `--tensor-parallel-size` / "
        f"`--pipeline-parallel-size` or their product above {MAX_PARALLEL}, `--hf-token` on the "
        "command line), unknown subcommand, bad patch name, a missing, unwritable or too long "
        "`TMPDIR`, a port in use, a bad `INTEL_VLLM_PROBE_PORT`, an "
        "`INTEL_VLLM_STATE_FILE` that is not a file path) or a "
        "container too small for vLLM (`/dev/shm`, memory limit)",
    ),
    (
        str(Exit.NO_DEVICE.value),
        "no accelerator device: the XPU image found no Intel GPU render node (`/dev/dri/renderD*`; "
        "pass `--device /dev/dri`), nothing started",
    ),
    (
        str(Exit.PREFETCH.value),
        "`prefetch` could not download the model (hub unreachable, unknown repository, "
        "a gated model without `HF_TOKEN`)",
    ),
    (
        str(Exit.UNEXPECTED.value),
        "vLLM exited without being asked to, even with code 0 (e.g. a "
        "worker or the engine died): orchestrators must restart it",
    ),
    (
        str(Exit.FORCED.value),
        "forced kill: the deadline (or a second signal) made the entrypoint kill the process group",
    ),
    (str(Exit.CANNOT_EXEC.value), "vLLM could not be executed"),
    (str(Exit.NOT_FOUND.value), "vLLM is not installed for this Python"),
)


def exit_code(returncode: int, *, stop_requested: bool, escalated: bool) -> int:
    """The entrypoint's exit code for vLLM's returncode (Popen style: -N = killed by signal N)."""
    if escalated and returncode != 0:
        return Exit.FORCED
    if returncode < 0:
        return 128 - returncode
    if not stop_requested:
        return Exit.UNEXPECTED if returncode == 0 else returncode
    return returncode


# ---------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    meaning: str


SETTINGS = (
    Setting(
        "INTEL_VLLM_DRAIN_TIMEOUT",
        f"`{DEFAULT_DRAIN_S}`",
        f"seconds in-flight requests get after SIGTERM (0 to {MAX_DRAIN_S}); passed as "
        "`--shutdown-timeout` only "
        "when you give that vLLM setting nowhere (command line or `--config` file): else your "
        f"value is the drain, untouched. On XPU never below {XPU_MIN_DRAIN_S} (logged when "
        "raised; the raised value is appended last on the command line, which beats the file).",
    ),
    Setting(
        "INTEL_VLLM_MODEL",
        "built-in tiny model",
        "what `entrypoint.py` / `entrypoint.py serve` serve with no model argument",
    ),
    Setting(
        "HF_HUB_OFFLINE",
        "`1` in the images",
        "the one switch for a model from a Hugging Face hub: `0` lets `prefetch` and vLLM "
        "download a repo id (e.g. `INTEL_VLLM_MODEL=ORG/NAME`) into `HF_HOME` "
        "(`/home/vllm/.cache/huggingface`), `HF_TOKEN` for gated models; `1` serves local "
        "paths and what that cache already holds (see docs/models.md)",
    ),
    Setting("INTEL_VLLM_DEVICE", "`cpu`", "`cpu` or `xpu` (the XPU image sets it)"),
    Setting(
        "INTEL_VLLM_STATE_FILE",
        "`$TMPDIR/vllm-intel-<uid>/vllm-intel-<port>.state.json` (a 0700 directory of this user)",
        "where the supervisor publishes its state for `probe`: a file it replaces while it "
        "runs (mode 0600) and removes at exit if it is still the one it wrote; a directory, "
        "a symlink or a path under a non-directory there is refused (exit "
        f"{Exit.CONFIG.value})",
    ),
    Setting(
        "INTEL_VLLM_PORT",
        f"`{DEFAULT_PORT}`",
        "the port `probe` checks when it is given no `--port`",
    ),
    Setting(
        "INTEL_VLLM_PROBE_PORT",
        "unset (off); `8001` in the images",
        "the supervisor answers `GET /ready` and `GET /live` (200 or 503) on this port: "
        "Kubernetes httpGet probes, and `probe ready|live` without `--port` asks it. "
        f"A port 1-65535 other than vLLM's own, else `serve` exits {Exit.CONFIG.value}",
    ),
    Setting(
        "INTEL_VLLM_SHM_DIR",
        "`/dev/shm`",
        "where vLLM's shared memory leftovers are swept, and whose free space the preflight "
        "checks against what vLLM's message queues need",
    ),
    Setting(
        "INTEL_VLLM_CPU_PLAN",
        "`1`",
        "CPU image: `1` = OpenMP threads from the CPU quota (`OMP_NUM_THREADS`); vLLM's "
        "shared-memory queue readers waiting for the writer's wake-up instead of spinning under "
        "a quota below the allowed CPUs or with fewer than 2 CPUs beside vLLM's OpenMP threads "
        "on more than one CPU (`VLLM_SHM_BROADCAST_BUSY_SLEEP_S`); `VLLM_CPU_KVCACHE_SPACE` "
        "from the memory limit (see `entrypoint.py plan`, docs/deploy.md). `pin` (opt-in) = the "
        "same and, under a quota below the allowed CPUs, every vLLM process confined to "
        "ceil(quota) CPUs, the idlest at start (one per physical core first), moved while it runs "
        "when other work loads them (the readers wait as above, but spin when pinned to one CPU "
        "under a one-CPU quota: a one-CPU cpuset in all but name); `0` = leave vLLM's own "
        "defaults. "
        "Your own "
        "`VLLM_CPU_OMP_THREADS_BIND` / `OMP_NUM_THREADS` / `VLLM_SHM_BROADCAST_BUSY_SLEEP_S` / "
        "`VLLM_CPU_KVCACHE_SPACE` always win (your threads: nothing pinned; with `pin`, exit 64).",
    ),
    Setting(
        "INTEL_VLLM_PATCHES`, `INTEL_VLLM_PATCHES_DISABLE`, `INTEL_VLLM_PATCHES_STRICT",
        "all, none, off",
        "patch allow list, deny list, strict mode (see docs/patches.md)",
    ),
    Setting(
        "INTEL_VLLM_PATCHES_UNTESTED",
        "off",
        "`1` applies a patch also where the installed vLLM is outside the releases it was tested "
        "on (default: state `untested`, nothing changed; see docs/patches.md)",
    ),
)

# The vLLM settings the supervisor also reads (vllm_args.py), each from the same sources as
# vLLM with its precedence: command line (`--flag V` / `--flag=V`, last wins) > the file of
# `--config FILE.yaml` > vLLM's default. `vllm serve` reads none of them from the environment
# (VLLM_PORT is an internal port, not the API port).
VLLM_SETTINGS = (
    Setting("model", "`INTEL_VLLM_MODEL`", "the built-in model is added only if none is named"),
    Setting("--port`, `--host", f"`{DEFAULT_PORT}`, all", "where /health and /metrics are read"),
    Setting(
        "--shutdown-timeout",
        "`INTEL_VLLM_DRAIN_TIMEOUT`",
        f"the drain (see above), 0 to {MAX_DRAIN_S} s",
    ),
    Setting("--ssl-certfile", "none", "/health and /metrics are read over https"),
    Setting("--disable-log-stats", "off", "no request counts in the exit line"),
    Setting(
        "--tensor-parallel-size`, `--pipeline-parallel-size",
        "1, 1",
        "workers: the CPU plan's threads per worker and the /dev/shm preflight; each and "
        f"their product at most {MAX_PARALLEL}",
    ),
    Setting(
        "--revision`, `--download-dir",
        "main, the hub cache",
        "what `prefetch` downloads and where; where the download progress is read",
    ),
    Setting(
        "--uds`, `--headless`, `--grpc`, `--api-server-count 0`, `--ssl-cert-reqs 2",
        "off",
        f"refused (exit {Exit.CONFIG.value}): the supervisor could not reach vLLM's HTTP server",
    ),
    Setting(
        "--config=FILE`, `--shutdown-time",
        "",
        f"refused (exit {Exit.CONFIG.value}): vLLM ignores `--config=FILE`, write "
        "`--config FILE`; the flags above are read only when written in full, not abbreviated",
    ),
    Setting(
        "--config FILE",
        "none",
        f"a regular YAML file of at most {MAX_CONFIG_BYTES >> 20} MiB, UTF-8, without "
        "aliases (`*name`); values of the flags above must be scalars",
    ),
    Setting(
        "--hf-token",
        "",
        f"refused on the command line (exit {Exit.CONFIG.value}): every process can read "
        "it in /proc/PID/cmdline; set `HF_TOKEN` in the environment instead",
    ),
)

USAGE = """\
entrypoint.py                          serve the built-in model ($INTEL_VLLM_MODEL)
entrypoint.py serve [MODEL] [FLAGS]    vllm serve MODEL FLAGS (flags passed through untouched)
entrypoint.py prefetch [MODEL] [FLAGS] download what serve would: the model at --revision into
                                       --download-dir or the hub cache (no-op: local, offline)
entrypoint.py patches                  patch table: name, state, reason
entrypoint.py probe ready|live [--port N]   exit 0/1 (compose healthcheck, exec probes)
entrypoint.py grace-period [FLAGS]     the orchestrator grace period for these serve flags + env
entrypoint.py plan [MODEL] [FLAGS]     what the container gives (CPUs, quota, memory, /dev/shm)
                                       and the threads / KV cache serve would use; exit 64 if short"""


class ConfigError(Exception):
    """Bad input: reported as one line, exit 64, nothing started."""


class State(enum.Enum):
    STARTING = "STARTING"
    SERVING = "SERVING"
    DRAINING = "DRAINING"
    KILLING = "KILLING"


def log(msg: str) -> None:
    print(f"[entrypoint] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------- parsing

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILTIN_MODELS = (
    pathlib.Path("/opt/vllm-intel/models/tiny-llama"),  # inside the images
    ROOT / "build" / "tiny-llama",  # a checkout after `make setup`
)
RUN_DIR_PREFIX = "vllm-intel-run-"
# vLLM binds ZeroMQ ipc sockets named by a uuid in the run dir; a unix socket path has 107 bytes.
MAX_TMPDIR_LEN = 107 - len(RUN_DIR_PREFIX) - 8 - 2 - 36


def device(env=os.environ) -> str:
    dev = env.get("INTEL_VLLM_DEVICE") or env.get("VLLM_TARGET_DEVICE") or "cpu"
    if dev not in ("cpu", "xpu"):
        raise ConfigError(f"INTEL_VLLM_DEVICE must be cpu or xpu, not {shown(dev)}")
    return dev


def shown(value, limit: int = 40, quote: bool = True) -> str:
    """repr(value) (or a printable str as it is, quote=False), cut to `limit` characters: an
    error line stays one short line whatever the input."""
    if not quote and isinstance(value, str) and value.isprintable() and len(value) <= limit:
        return value
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 4]}...{text[-1]} ({len(str(value))} chars)"


def parse_seconds(name: str, value: str | None, maximum: int = MAX_DRAIN_S) -> int:
    """Whole seconds, 0..maximum (ASCII digits, surrounding blanks allowed). Raises ConfigError."""
    if not re.fullmatch(r"\s*[0-9]+\s*", value or ""):
        raise ConfigError(f"{name} must be a whole number of seconds >= 0, not {shown(value)}")
    digits = value.strip().lstrip("0") or "0"
    if len(digits) > MAX_DIGITS or int(digits) > maximum:  # int() of 5000 digits would raise
        raise ConfigError(f"{name} must be at most {maximum} seconds, not {shown(value.strip())}")
    return int(digits)


def parse_port(name: str, value: str | None) -> int:
    """A TCP port number, 1..65535 (ASCII digits). Raises ConfigError."""
    if re.fullmatch(r"\s*[0-9]{1,5}\s*", value or "") and 0 < int(value) < 65536:
        return int(value)
    raise ConfigError(f"{name} must be a port number (1-65535), not {shown(value)}")


def check_port_number(name: str, port: int) -> int:
    """An int port from vLLM's flags or its config file: 1..65535. Raises ConfigError."""
    if type(port) is not int or not 1 <= port <= 65535:
        raise ConfigError(f"{name} must be between 1 and 65535, not {shown(port)}")
    return port


def flag_value(flags: list[str], name: str) -> str | None:
    """Value of `--name V` or `--name=V` in vLLM flags (last one wins, as argparse does)."""
    found = None
    for i, arg in enumerate(flags):
        if arg == name:
            if i + 1 >= len(flags):
                raise ConfigError(f"{name} needs a value")
            found = flags[i + 1]
        elif arg.startswith(name + "="):
            found = arg.split("=", 1)[1]
    return found


def drain_seconds(
    flags: list[str] | None = None, env=os.environ, user: int | None = None
) -> tuple[int, list[str]]:
    """DRAIN and the notes explaining how it was chosen. user: the --shutdown-timeout vLLM
    resolved from the command line or its config file (None: given nowhere)."""
    notes = []
    if user is None and flags:
        from .vllm_args import resolve

        user = resolve(flags).shutdown_timeout
    if user is not None:
        if user < 0:
            raise ConfigError(f"--shutdown-timeout must be >= 0, not {user}")
        if user > MAX_DRAIN_S:
            raise ConfigError(
                f"--shutdown-timeout must be at most {MAX_DRAIN_S} seconds, not {user}"
            )
        drain = user
    else:
        drain = parse_seconds(
            "INTEL_VLLM_DRAIN_TIMEOUT", env.get("INTEL_VLLM_DRAIN_TIMEOUT", str(DEFAULT_DRAIN_S))
        )
    if device(env) == "xpu" and drain < XPU_MIN_DRAIN_S:
        notes.append(
            f"drain raised from {drain} s to {XPU_MIN_DRAIN_S} s: XPU workers need it "
            "to release Level Zero / oneCCL resources"
        )
        drain = XPU_MIN_DRAIN_S
    return drain, notes


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


def probe_port(env=os.environ, vllm_port: int | None = None) -> int | None:
    """INTEL_VLLM_PROBE_PORT for `serve`: None when unset, else a port other than vLLM's."""
    value = env.get("INTEL_VLLM_PROBE_PORT")
    if not value:
        return None
    port = parse_port("INTEL_VLLM_PROBE_PORT", value)
    if port == vllm_port:
        raise ConfigError(
            f"INTEL_VLLM_PROBE_PORT {port} is vLLM's own --port: choose another port for the probes"
        )
    return port


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


def patch_names() -> list[str]:
    """The names of the patches in vllm_intel/patches/registry.py's PATCH_MODULES, read from
    their sources (`name = "..."` in the Patch class): importing them would import torch."""
    import ast

    from vllm_intel.patches import registry

    names = []
    for module in registry.PATCH_MODULES:
        tree = ast.parse((pathlib.Path(registry.__file__).parent / f"{module}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(
                getattr(b, "id", None) == "Patch" for b in node.bases
            ):
                for item in node.body:
                    if (
                        isinstance(item, ast.Assign)
                        and [getattr(t, "id", None) for t in item.targets] == ["name"]
                        and isinstance(item.value, ast.Constant)
                    ):
                        names.append(item.value.value)
    return names


def check_patches(env=os.environ) -> None:
    """INTEL_VLLM_PATCHES / INTEL_VLLM_PATCHES_DISABLE name known patches. Raises ConfigError:
    vLLM's plugin would only log the unknown names once the model is loading."""
    from vllm_intel.patches import registry

    known = patch_names()
    for var in (registry.ALLOW_ENV, registry.DENY_ENV):
        unknown = [n for n in registry._names(env.get(var)) or [] if n not in known]
        if unknown:
            raise ConfigError(
                f"{var}: unknown patch name(s) {shown(','.join(unknown), 80, quote=False)}; "
                f"known: {','.join(sorted(known))}"
            )


@dataclass
class ServeConfig:
    argv: list[str]
    port: int
    drain: int
    notes: list[str]
    model: str | None = None  # positional, --model or the config file's (the CPU plan's weights)
    flags: list[str] | None = None  # the vLLM flags as passed on
    url: str = ""  # where the supervisor reads vLLM's /health and /metrics
    count_requests: bool = True  # vLLM exports its vllm:* metrics (no --disable-log-stats)
    host: str | None = None  # vLLM's --host (None: every interface)

    def __post_init__(self):
        self.url = self.url or f"http://127.0.0.1:{self.port}"


def poll_url(host: str | None, port: int, tls: bool) -> str:
    """The address the supervisor asks: vLLM's own host, loopback when it listens everywhere."""
    if host in (None, "", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}"


def strip_flag(flags: list[str], name: str) -> list[str]:
    """flags without `name V` / `name=V` (underscore spellings included)."""
    out, skip = [], False
    for f in flags:
        if skip:
            skip = False
            continue
        key = f.split("=", 1)[0].replace("_", "-")
        if key == name:
            skip = "=" not in f
            continue
        out.append(f)
    return out


def serve_config(args: list[str], env=os.environ) -> ServeConfig:
    """`vllm serve` argv, port and drain for `entrypoint.py serve ARGS`. Raises ConfigError.

    Every vLLM setting read here comes from vllm_args.resolve: the command line, then the file
    of `--config FILE`, then vLLM's default, as vLLM itself resolves them."""
    from .vllm_args import resolve

    flags = list(args)
    vargs = resolve(flags)
    if vargs.uds:
        raise ConfigError(
            f"--uds {vargs.uds} (in {vargs.source['uds']}): vLLM would listen on a unix socket "
            "only; the supervisor's readiness checks and probes need its TCP port"
        )
    no_http = (
        "--headless"
        if vargs.headless
        else "--grpc"
        if vargs.grpc
        else f"--api-server-count {vargs.api_server_count}"
        if vargs.api_server_count is not None and vargs.api_server_count < 1
        else None
    )
    if no_http:
        raise ConfigError(
            f"{no_http}: vLLM would start no HTTP API server, so the supervisor could never see "
            "it ready; run `vllm serve` directly for that"
        )
    if vargs.ssl_cert_reqs == 2:  # ssl.CERT_REQUIRED
        raise ConfigError(
            "--ssl-cert-reqs 2: vLLM would demand a client certificate, which the supervisor's "
            "own /health and /metrics requests cannot present"
        )
    model = None
    if vargs.model is None:
        model = env.get("INTEL_VLLM_MODEL") or next(
            (str(p) for p in BUILTIN_MODELS if (p / "config.json").exists()), None
        )
        if model is None:
            raise ConfigError(
                "no model given and the built-in model is missing "
                "(set INTEL_VLLM_MODEL, pass a model, or run `make setup`)"
            )
    name = vargs.model or model
    check_model_path(name)
    port = check_port_number("--port", DEFAULT_PORT if vargs.port is None else vargs.port)
    if vargs.host and not re.fullmatch(r"[A-Za-z0-9._:%-]{1,253}", vargs.host):
        raise ConfigError(
            f"--host {shown(vargs.host)} (in {vargs.source['host']}): not a host name or IP address"
        )
    drain, notes = drain_seconds(env=env, user=vargs.shutdown_timeout)
    if vargs.shutdown_timeout is not None:
        notes.insert(
            0,
            f"drain {vargs.shutdown_timeout} s: --shutdown-timeout from "
            f"{vargs.source['shutdown_timeout']}",
        )
    if vargs.shutdown_timeout is None or drain != vargs.shutdown_timeout:
        # Only when the user gave no value anywhere, or on XPU below the minimum. The command
        # line beats the config file and its last flag wins, so the appended flag is the one
        # vLLM uses; the user's own command-line copies go, not to leave two values around.
        flags = strip_flag(flags, "--shutdown-timeout") + ["--shutdown-timeout", str(drain)]
    # vLLM's CLI, run by vllm_intel.process_exit: exits without interpreter finalization where
    # the fast-exit patch enables it (see there), otherwise exactly as `-m vllm.entrypoints.cli.main`.
    argv = [sys.executable, "-m", "vllm_intel.process_exit", "vllm.entrypoints.cli.main", "serve"]
    return ServeConfig(
        argv + ([model] if model else []) + flags,
        port,
        drain,
        notes,
        model=name,
        flags=flags,
        url=poll_url(vargs.host, port, tls=vargs.ssl_certfile is not None),
        count_requests=not vargs.disable_log_stats,
        host=vargs.host,
    )


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


def check_port(host: str | None, port: int) -> None:
    """Preflight: vLLM's port is free. Else vLLM fails to bind only after loading the model, and
    meanwhile whatever holds the port answers the supervisor's /health as if vLLM were ready."""
    import socket

    # vLLM's own bind (create_server_socket, vllm/entrypoints/launchers/launcher.py): its --host
    # or every IPv4 interface, SO_REUSEADDR (a socket in TIME_WAIT does not block it).
    addr = host or ""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((addr, port))
        except (TypeError, ValueError, UnicodeError) as e:  # a host no socket can name
            raise ConfigError(f"cannot listen on {shown(host)}:{port}: {e}") from None
        except OSError as e:
            where = f"{host}:{port}" if host else f"port {port}"
            raise ConfigError(
                f"cannot listen on {where}: {e.strerror or e} (another server holds it? "
                "choose another with --port)"
            ) from None


def cache_home(env=os.environ) -> pathlib.Path:
    """$XDG_CACHE_HOME, else ~/.cache: where vLLM, torch and we keep caches."""
    return pathlib.Path(env.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")


def inductor_cache(env=os.environ) -> pathlib.Path:
    """TORCHINDUCTOR_CACHE_DIR for vLLM: compiled kernels kept across runs, outside the run dir."""
    return cache_home(env) / "vllm-intel" / "torchinductor"
