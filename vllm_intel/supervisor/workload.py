"""What vLLM will need of the container for `vllm serve [MODEL] FLAGS`, before it starts: its
processes (API servers, an engine core per data-parallel rank, TP x PP workers under each), its
shared-memory segments, the size of a local model's weights and the KV
cache one request of its context takes (context.py); and the /dev/shm preflight that fails in one
line instead of a SIGBUS later.
"""

from __future__ import annotations

import math
import os
import pathlib
import shutil
import stat
from dataclasses import dataclass

from .context import Context, context, small_json
from .errors import ConfigError, parse_whole, shown
from .limits import GiB, MiB
from .paths import path_exists, user_path
from .vllm_args import VllmArgs, resolve

# vLLM's shared memory (vllm/distributed/device_communicators/shm_broadcast.py,
# vllm/v1/executor/multiproc_executor.py, identical in 0.27.1 and 0.32.0): the executor's
# broadcast MessageQueue (VLLM_MQ_MAX_CHUNK_BYTES_MB chunks x 10) and one response MessageQueue
# per worker (24 MiB chunks x 10), each a ShmRingBuffer of (chunk + 1 + readers) x chunks bytes;
# with --enable-shm-tensor-arena an arena of 8 x 256 MiB slots; with TP/PP > 1 a broadcaster of
# 6 x 4 MiB chunks per group. vLLM's check_shm_free_space() checks each segment alone when it is
# created, but every chunk of a ring buffer is written as messages go round, so all of them end up
# resident: too small a /dev/shm then fails later, with SIGBUS.
MQ_CHUNKS = 10
MQ_RESPONSE_CHUNK = 24 * MiB
ARENA_SLOTS, ARENA_SLOT = 8, 256 * MiB
GROUP_MQ_CHUNKS, GROUP_MQ_CHUNK = 6, 4 * MiB


@dataclass(frozen=True)
class Workload:
    """What one `vllm serve` run asks of the container (the plan's input besides the limits)."""

    tp: int
    pp: int
    shm_needed: int  # bytes of /dev/shm its message queues end up using
    weights: int | None  # bytes of a local model's weight files; None: not a local directory
    context: Context | None = None  # one request of the whole context; None: not known here
    dp: int = 1  # data-parallel ranks: an engine core each, with its own TP x PP workers
    api_servers: int = 1  # vLLM's API server processes (--api-server-count, default dp)
    kv_flag: str | None = None  # --kv-cache-memory-bytes as given: each worker's KV cache, yours

    @property
    def workers(self) -> int:
        return self.dp * self.tp * self.pp


def workload(
    flags: list[str], model: str | None, env=os.environ, found: VllmArgs | None = None
) -> Workload:
    """Read once: it may walk the model directory. found: the flags' vLLM settings, resolved
    (ServeConfig.vargs); else resolved here, which may read a --config file."""
    found = found or resolve(flags)
    tp, pp = _sizes(found)
    dp = found.data_parallel_size or 1
    if dp < 1:
        raise ConfigError(f"--data-parallel-size must be a whole number >= 1, not {shown(dp)}")
    shm = dp * sum(size for _, size in _segments(flags, tp, pp, env))  # an executor per rank
    local = model_dir(model)  # once: the weights and the context read the same directory
    weights = weights_in(local, model)  # first: its errors name an unreadable model directory
    return Workload(
        tp,
        pp,
        shm,
        held_weights(weights, found.dtype, local),
        context(found, local),
        dp=dp,
        api_servers=found.api_server_count or dp,  # vLLM's default: one per rank
        kv_flag=found.kv_cache_memory_bytes,
    )


def ring_buffer_bytes(chunk: int, chunks: int, readers: int) -> int:
    """ShmRingBuffer.total_bytes_of_buffer: (max_chunk_bytes + 1 + n_reader) * max_chunks."""
    return (chunk + 1 + readers) * chunks


def parallel(flags: list[str]) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes of `vllm serve FLAGS`, from the command line or its
    --config file as vLLM resolves them (vllm_args)."""
    return _sizes(resolve(flags))


def _sizes(found) -> tuple[int, int]:
    sizes = []
    for name, value in (
        ("--tensor-parallel-size", found.tensor_parallel_size),
        ("--pipeline-parallel-size", found.pipeline_parallel_size),
    ):
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be a whole number >= 1, not {shown(value)}")
        sizes.append(value or 1)
    return sizes[0], sizes[1]  # their product is bounded by vllm_args.resolve (MAX_PARALLEL)


def shm_segments(flags: list[str], env=os.environ) -> list[tuple[str, int]]:
    """The shared memory segments vLLM creates for `vllm serve FLAGS` on one node (see above)."""
    return _segments(flags, *parallel(flags), env)


def _segments(flags: list[str], tp: int, pp: int, env) -> list[tuple[str, int]]:
    workers = tp * pp
    chunk_mb = parse_whole(
        "VLLM_MQ_MAX_CHUNK_BYTES_MB", env.get("VLLM_MQ_MAX_CHUNK_BYTES_MB", "16")
    )
    segs = [("executor broadcast queue", ring_buffer_bytes(chunk_mb * MiB, MQ_CHUNKS, workers))]
    segs += [
        ("worker response queue", ring_buffer_bytes(MQ_RESPONSE_CHUNK, MQ_CHUNKS, 1))
    ] * workers
    if workers > 1:
        groups = (tp > 1) + (pp > 1)
        segs += [
            ("TP/PP group broadcaster", ring_buffer_bytes(GROUP_MQ_CHUNK, GROUP_MQ_CHUNKS, workers))
        ] * (groups * workers)
    if "--enable-shm-tensor-arena" in flags:
        segs.append(("tensor arena", ring_buffer_bytes(ARENA_SLOT, ARENA_SLOTS, workers)))
    return segs


MAX_MODEL_ENTRIES = 100_000  # a model directory holds tens of files; `/` holds millions


def model_dir(model: str | None) -> pathlib.Path | None:
    """The model's local directory; None for a hub id (or no model)."""
    if not model:
        return None
    path = user_path("model path", model)
    return path if path_exists("model path", path) and path.is_dir() else None


def weights_bytes(model: str | None) -> int | None:
    """Size of a local model's weight files; None when the model is not a local directory."""
    return weights_in(model_dir(model), model)


def weights_in(path: pathlib.Path | None, model: str | None) -> int | None:
    """Size of the weight files under `path` (the directory of `model`, as the user wrote it).
    Raises ConfigError for a directory it cannot read through, or one too big to be a model."""
    if path is None:
        return None
    exts = (".safetensors", ".bin", ".pt", ".pth", ".gguf")

    def unreadable(e: OSError) -> None:
        raise ConfigError(
            f"model path {shown(model, 200, quote=False)}: cannot read {shown(str(e.filename or ''), 200, quote=False)}: "
            f"{e.strerror or e}"
        )

    total = entries = 0
    for top, dirs, files in os.walk(path, onerror=unreadable):  # symlinked dirs not followed
        entries += len(dirs) + len(files)
        if entries > MAX_MODEL_ENTRIES:
            raise ConfigError(
                f"model path {shown(model, 200, quote=False)} holds more than {MAX_MODEL_ENTRIES} files "
                "and directories: not a model directory"
            )
        for name in files:
            if not name.endswith(exts):
                continue
            try:
                st = os.stat(os.path.join(top, name))
            except FileNotFoundError:  # a dangling link: vLLM would not load it either
                continue
            except OSError as e:
                unreadable(e)
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


# Bytes per weight vLLM holds for --dtype, and per weight a checkpoint's config says it stores
# (vllm/config/model.py, _get_and_verify_dtype: `auto` keeps a 16-bit checkpoint's type and casts a
# float32 one down to 16 bits on CPU; `float32` casts a 16-bit one up).
HELD_BYTES = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2}
STORED_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def held_weights(files: int | None, dtype: str | None, path: pathlib.Path | None) -> int | None:
    """The weights in memory: their files' size, twice it where --dtype float32 holds a 16-bit
    checkpoint's weights in 32 bits. Never less than the files (a float32 checkpoint served in 16
    bits is still mapped whole while it loads); the files' size where the config does not say its
    type, or the weights are quantized."""
    cfg = small_json(path / "config.json") if files and path is not None else None
    if cfg is None or "quantization_config" in cfg or not isinstance(dtype, str):
        return files
    stored = next((cfg[k] for k in ("torch_dtype", "dtype") if isinstance(cfg.get(k), str)), "")
    held, kept = HELD_BYTES.get(dtype.lower()), STORED_BYTES.get(stored)
    return files * held // kept if held and kept and held > kept else files


def check_shm(shm_dir: pathlib.Path, needed: int) -> None:
    """Preflight: the one-line version of vLLM's check_shm_free_space() (shm_broadcast.py),
    for all of vLLM's segments at once and before anything starts."""
    if not shm_dir.is_dir():
        return  # as vLLM: no /dev/shm, no check
    free = shutil.disk_usage(shm_dir).free
    if needed > free:
        size = max(1, math.ceil(2 * needed / GiB))
        raise ConfigError(
            f"{shm_dir} has {free / MiB:.0f} MiB free, vLLM needs {needed / MiB:.0f} MiB for its "
            f"message queues: run with docker run --shm-size={size}g (compose: shm_size: {size}g; "
            f"Kubernetes: an emptyDir with medium: Memory mounted at /dev/shm)"
        )
