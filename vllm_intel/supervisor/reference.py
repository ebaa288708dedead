"""The user-facing reference as data: each setting's name, default and one-line summary, the vLLM
settings read, the subcommands and the exit codes. README.md, docs/settings.md and `entrypoint.py
--help` render their tables from it (vllm_intel.supervisor.docs; a test fails when a copy
differs); the prose explaining each one lives in docs/settings.md, checked against these names
and numbers by tests/supervisor/test_docs.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import Exit
from .settings import DEFAULT_PORT
from .timing import DEFAULT_DRAIN_S, MARGIN_S, MAX_DRAIN_S
from .vllm_args import MAX_CONFIG_BYTES, MAX_PARALLEL


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    meaning: str


# (code, meaning): the table every doc shows.
EXIT_CODES = (
    ("vLLM's own", "vLLM exited after a stop request: `0` after a clean drain"),
    (
        "128+N",
        "vLLM died of signal N; or signal N (SIGTERM, SIGINT) stopped the entrypoint before vLLM "
        "was started: nothing to drain",
    ),
    (
        str(Exit.CONFIG.value),
        "configuration error or a container too small for vLLM: one line, nothing started "
        "(the cases: docs/settings.md)",
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


SETTINGS = (
    Setting(
        "INTEL_VLLM_DRAIN_TIMEOUT",
        f"`{DEFAULT_DRAIN_S}`",
        "seconds in-flight requests get after SIGTERM",
    ),
    Setting(
        "INTEL_VLLM_MODEL",
        "built-in tiny model",
        "what `entrypoint.py` / `entrypoint.py serve` serve with no model argument",
    ),
    Setting(
        "HF_HUB_OFFLINE",
        "`1` in the images",
        "`0` lets `prefetch` and vLLM download a Hugging Face repo id",
    ),
    Setting("INTEL_VLLM_DEVICE", "`cpu`", "`cpu` or `xpu` (the XPU image sets it)"),
    Setting(
        "INTEL_VLLM_STATE_FILE",
        "`$TMPDIR/vllm-intel-<uid>/vllm-intel-<port>.state.json` (a 0700 directory of this user)",
        "where the supervisor publishes its state for `probe`",
    ),
    Setting("INTEL_VLLM_PORT", "`8000`", "the port `probe` checks when it is given no `--port`"),
    Setting(
        "INTEL_VLLM_PROBE_PORT",
        "unset (off); `8001` in the images",
        "the supervisor answers `GET /ready`, `GET /live` and `GET /metrics` on this port",
    ),
    Setting(
        "INTEL_VLLM_METRICS_LINGER_S",
        "`0`",
        f"seconds the probe port's `/metrics` stays up after a drain (0 to {MARGIN_S})",
    ),
    Setting(
        "INTEL_VLLM_LOG_FORMAT",
        "`text`",
        "`json`: every line of a `serve` run is one JSON object (the supervisor's and vLLM's)",
    ),
    Setting(
        "INTEL_VLLM_SHM_DIR",
        "`/dev/shm`",
        "where vLLM's shared-memory leftovers are swept and free space checked",
    ),
    Setting(
        "INTEL_VLLM_CPU_PLAN",
        "`1`",
        "`1`: threads and KV cache from the limits; `0`: off",
    ),
    Setting(
        "INTEL_VLLM_PATCHES`, `INTEL_VLLM_PATCHES_DISABLE`, `INTEL_VLLM_PATCHES_STRICT",
        "all, none, off",
        "patch allow list, deny list, strict mode",
    ),
    Setting(
        "INTEL_VLLM_PATCHES_UNTESTED",
        "off",
        "`1` applies patches also outside the vLLM releases they were tested on",
    ),
)


# The settings users change most, in README's order: its "Settings you will change" table
# (docs.common_settings_table), each row taken from SETTINGS or VLLM_SETTINGS by name.
COMMON = (
    "INTEL_VLLM_DRAIN_TIMEOUT",
    "--shutdown-timeout",
    "INTEL_VLLM_MODEL",
    "HF_HUB_OFFLINE",
    "INTEL_VLLM_PROBE_PORT",
    "INTEL_VLLM_LOG_FORMAT",
    "INTEL_VLLM_CPU_PLAN",
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
    Setting(
        "--disable-log-stats", "off", "no request counts from /metrics (drain-deadline's remain)"
    ),
    Setting(
        "--tensor-parallel-size`, `--pipeline-parallel-size`, `--data-parallel-size",
        "1, 1, 1",
        "workers (their product) and engine cores (one per data-parallel rank): the CPU plan's "
        "threads per worker, memory per process (each worker its own KV cache) and the "
        f"/dev/shm preflight; each and their product at most {MAX_PARALLEL}",
    ),
    Setting(
        "--api-server-count",
        "the data-parallel size",
        "API server processes the CPU plan counts",
    ),
    Setting(
        "--kv-cache-memory-bytes",
        "none",
        "each worker's KV cache, yours: the plan sets no `VLLM_CPU_KVCACHE_SPACE` (which would "
        "override it) and checks it against the memory limit",
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
        "--hf-token`, `--api-key",
        "",
        f"refused on the command line (exit {Exit.CONFIG.value}): every process can read "
        "it in /proc/PID/cmdline; set `HF_TOKEN` / `VLLM_API_KEY` in the environment instead "
        "(or put them in the `--config` file)",
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
