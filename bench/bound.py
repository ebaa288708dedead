"""The memory-bandwidth bound of decoding: a decode step reads every weight once, so N streams
decoding together get at most N x (read bandwidth / bytes of weights per step) tokens a second.
runtime.py measures the host's read bandwidth at the start of its run (read_bandwidth) and
reports ours as a fraction of the bound per shape and stream count (rows "ours / bound").

Bytes per step: every tensor of the checkpoint once (its dtype's size), except an input
embedding that is not also the output layer, of which a step reads only the streams' rows; a
tied embedding is read whole, as the output layer. KV cache reads are left out (short contexts:
a few MB against the weights' hundreds)."""

from __future__ import annotations

import json
import pathlib
import statistics
import struct
import time

# safetensors dtype names -> bytes per element
DTYPE_BYTES = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "BF16": 2, "F16": 2, "I16": 2,
               "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1}  # fmt: skip
INPUT_EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")
HEADER_MAX = 100 << 20  # a safetensors header beyond this is no checkpoint of ours


def tensors(path: pathlib.Path) -> dict[str, int]:
    """{tensor name: bytes} from a safetensors file's header, without reading the data."""
    with path.open("rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        if size > HEADER_MAX:
            raise ValueError(f"{path}: a header of {size} bytes")
        header = json.loads(fh.read(size))
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        n = DTYPE_BYTES[meta["dtype"]]
        for dim in meta["shape"]:
            n *= dim
        out[name] = n
    return out


def bytes_per_step(model_dir: str | pathlib.Path) -> int:
    """The weight bytes one decode step reads (module docstring)."""
    model_dir = pathlib.Path(model_dir)
    sizes: dict[str, int] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        sizes.update(tensors(f))
    if not sizes:
        raise ValueError(f"{model_dir}: no safetensors file")
    config = json.loads((model_dir / "config.json").read_text())
    tied = bool(config.get("tie_word_embeddings", False))
    total = sum(sizes.values())
    if not tied:
        total -= sum(n for name, n in sizes.items() if name.endswith(INPUT_EMBEDDINGS))
    return total


def read_bandwidth(mib: int = 512, repeats: int = 9, threads: int | None = None) -> float:
    """The host's read bandwidth in bytes/s: the median over `repeats` of torch summing a bf16
    buffer of `mib` MiB (far beyond the caches), with `threads` threads (default: torch's)."""
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        x = torch.ones(mib << 19, dtype=torch.bfloat16)  # 2 bytes an element
        x.sum()  # pages touched and faulted in before timing
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            x.sum()
            times.append(time.perf_counter() - t)
        return x.numel() * x.element_size() / statistics.median(times)
    finally:
        torch.set_num_threads(before)


def bound_tokens_per_s(streams: int, bandwidth: float, step_bytes: int) -> float:
    """Tokens/s at most for `streams` streams decoding together (module docstring)."""
    return streams * bandwidth / step_bytes
