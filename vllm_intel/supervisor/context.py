"""The KV cache one request of the model's whole context needs, before vLLM starts.

vLLM refuses to start when its KV cache cannot hold one request of `max_model_len` tokens
(vllm/v1/core/kv_cache_utils.py, check_enough_kv_cache_memory), but only after it has loaded the
weights and profiled the model: 35 s and a traceback for a 1 B model on 2 cores. A Llama-3.2-1B
config has a 131072-token context, 4 GiB of KV cache for one request; the CPU plan's 1 GiB cannot
hold it. The supervisor says so in one line before anything starts, with the `--max-model-len`
that fits.

It must never refuse what vLLM would start, so every number here is a lower bound of vLLM's, and
where one cannot be had (another architecture, sliding windows, overrides) nothing is checked:
- the context: `--max-model-len` as given; else the smallest of the config's length keys and the
  tokenizer's model_max_length, as vLLM derives it (vllm/config/model.py, _get_and_verify_max_len),
  without RoPE scaling factors, which only raise it;
- per token: K and V of every full-attention layer, 2 bytes each (1 with an fp8 KV cache), the
  KV heads a worker holds under tensor parallelism and the layers under pipeline parallelism
  rounded down; vLLM's block rounding and the block it holds back only add to it;
- a field of another type than vLLM's config takes (a list, a string, null, true, a float, a
  number past int64) leaves the context unknown: vLLM then refuses the model itself, or reads
  the value in a way not modelled here (true or 2048.0 as a length key is a length of 1 or 2048
  to its min()).
tests/supervisor/test_context.py holds the bound against vLLM's own check on its real classes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError, load_json, shown
from .limits import GiB
from .vllm_args import PRESENCE_ONLY

# Decoder-only models whose every layer attends to the whole context (unless their config says
# otherwise: sliding windows and layer types are checked below). A tuple: `in` compares, and a
# model_type may be a list or a mapping, which a set cannot hash.
FULL_ATTENTION = ("llama", "qwen2", "qwen3", "mistral")
# vllm/transformers_utils/model_arch_config_convertor.py, derive_max_model_len_and_key
LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
MAX_CONFIG_BYTES = 1 << 20
ROUND = 1024  # the --max-model-len suggested is a multiple of it (of 16 below it)
MAX_SIZE = 2**63 - 1  # int64: no length or shape vLLM allocates is larger; past it, unknown


@dataclass(frozen=True)
class Context:
    tokens: int  # max_model_len (a lower bound of vLLM's)
    source: str  # where it comes from, for the error line
    layers: int  # per worker
    kv_heads: int  # per worker
    head_dim: int
    dtype_bytes: int

    @property
    def per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def needed(self) -> int:
        return self.tokens * self.per_token

    def shape(self) -> str:
        return (
            f"{self.per_token / 1024:g} KiB/token: {self.layers} layers x {self.kv_heads} KV heads "
            f"x {self.head_dim} x K,V x {self.dtype_bytes} B"
        )

    def fitting(self, kv_bytes: int) -> int:
        """The longest context a KV cache of `kv_bytes` surely holds (0: none), leaving vLLM a
        block of up to 128 tokens it holds back."""
        tokens = kv_bytes // self.per_token - 128
        step = ROUND if tokens >= ROUND else 16
        return max(0, tokens // step * step)

    def kv_gib_needed(self) -> int:
        """Whole GiB of KV cache that hold one request, with the block vLLM holds back."""
        return math.ceil((self.needed + 128 * self.per_token) / GiB)


def max_model_len(value: str | None) -> int | None:
    """vLLM's --max-model-len (human_readable_int_or_auto: 4096, 4k, 4K, 25.6k); None: not given,
    `auto` / -1 (vLLM fits it to the memory) or what vLLM would refuse itself."""
    if value is None:
        return None
    m = re.fullmatch(r"(\d{1,12})(?:\.(\d{1,6}))?([kKmMgGtT]?)", value.strip())
    if not m:
        return None
    whole, frac, suffix = m.groups()
    if not suffix:
        return None if frac else int(whole)
    if suffix.isupper():  # binary multipliers take no decimals
        return None if frac else int(whole) * 1024 ** ("KMGT".index(suffix) + 1)
    return int(float(f"{whole}.{frac or 0}") * 1000 ** ("kmgt".index(suffix) + 1))


def context(found, path: Path | None) -> Context | None:
    """The context of `vllm serve` with the flags `found` (vllm_args.resolve) on the local model
    directory `path` (None: a hub id, whose config vLLM reads, not this), or None where it cannot
    be known for sure (see the module's docstring)."""
    if path is None or any(getattr(found, dest) is not None for dest in PRESENCE_ONLY):
        return None
    cfg = small_json(path / "config.json")
    if cfg is None or cfg.get("model_type") not in FULL_ATTENTION:
        return None
    if cfg.get("use_sliding_window") or (
        "use_sliding_window" not in cfg and cfg.get("sliding_window") is not None
    ):
        return None
    types = cfg.get("layer_types")
    if types is not None and (
        not isinstance(types, list) or any(t != "full_attention" for t in types)
    ):
        return None
    shape = _shape(cfg)
    length = None if shape is None else _length(found, cfg, path)
    if length is None:
        return None
    (layers, kv_heads, head_dim), (tokens, source) = shape, length
    tp = found.tensor_parallel_size or 1
    pp = found.pipeline_parallel_size or 1
    fp8 = "fp8" in (found.kv_cache_dtype or "")
    return Context(
        tokens=tokens,
        source=source,
        layers=layers // pp,
        kv_heads=max(1, kv_heads // tp),
        head_dim=head_dim,
        dtype_bytes=1 if fp8 else 2,
    )


def _shape(cfg: dict) -> tuple[int, int, int] | None:
    """(layers, KV heads, head size) as vLLM's config holds them, or None (not known here)."""
    names = ("num_hidden_layers", "num_attention_heads", "hidden_size")
    layers, heads, hidden = (cfg.get(k) for k in names)
    if not (_size(layers) and _size(heads) and _size(hidden)):
        return None
    kv_heads = cfg.get("num_key_value_heads")
    kv_heads = heads if kv_heads is None else kv_heads  # a 0 is not null: 1 per worker to vLLM
    head_dim = cfg.get("head_dim") or hidden // heads
    return (layers, kv_heads, head_dim) if _size(kv_heads) and _size(head_dim) else None


def _length(found, cfg: dict, path: Path) -> tuple[int, str] | None:
    """(max_model_len's lower bound, where it comes from), or None (not known here)."""
    given = max_model_len(found.max_model_len)
    if given is not None:
        return given, "--max-model-len"
    if found.max_model_len is not None:
        return None  # auto, or a value vLLM refuses itself
    if not _size(cfg.get("max_position_embeddings")):
        return None  # transformers' class default would apply, not known here
    lengths = {f"config.json {k}": cfg.get(k) for k in LENGTH_KEYS}
    tok = small_json(path / "tokenizer_config.json") or {}
    lengths["tokenizer_config.json model_max_length"] = tok.get("model_max_length")
    return _smallest(lengths)


def _smallest(lengths: dict) -> tuple[int, str] | None:
    """vLLM's min() over the lengths given (null: not given), or None where a value that is not
    a whole number could be below the others: min() takes true as 1 and 2048.0 as 2048, and fails
    on a string; a float above them (1e30, NaN) it never picks."""
    whole = {k: v for k, v in lengths.items() if type(v) is int and v > 0}
    if not whole:
        return None
    key = min(whole, key=whole.get)
    tokens = whole[key]
    if not all(v is None or type(v) in (int, float) and not v < tokens for v in lengths.values()):
        return None
    return (tokens, key) if _size(tokens) else None


def _size(value) -> bool:
    """A positive int of at most MAX_SIZE (true is an int to Python, not to vLLM's config)."""
    return type(value) is int and 0 < value <= MAX_SIZE


def small_json(path) -> dict | None:
    """A small JSON object file, or None (absent, unreadable, too big, not an object)."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        raw = path.read_bytes()
    except OSError:
        return None
    try:
        data = load_json(raw)
    except ValueError as e:
        if "nested" not in str(e):
            return None  # not JSON: vLLM says so itself
        # vLLM's own json.load would die in a RecursionError traceback after the imports
        raise ConfigError(f"{shown(str(path), 200, quote=False)}: {e}") from None
    return data if isinstance(data, dict) else None
