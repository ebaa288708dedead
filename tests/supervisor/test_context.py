"""The preflight of one request's KV cache (vllm_intel.supervisor.context, plan._check_context):
it refuses in one line, before anything starts, only where vLLM refuses too, and the
--max-model-len it suggests is one vLLM starts with. vLLM's side is its own check
(check_enough_kv_cache_memory) on its own config of the same model directory, without loading
weights: a config.json of each shape and the built-in model's tokenizer."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from tests.harness import ROOT
from vllm_intel.supervisor import context as cx
from vllm_intel.supervisor import plan as pl
from vllm_intel.supervisor.errors import ConfigError
from vllm_intel.supervisor.limits import GiB, Limits
from vllm_intel.supervisor.vllm_args import resolve
from vllm_intel.supervisor.workload import model_dir, workload

sys.path.insert(0, str(ROOT / "tools"))
import build_model  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def shape_dir(tmp_path, shape: str, **overrides) -> str:
    """A model directory with `shape`'s config.json (tools/build_model.py) and the built-in
    model's tokenizer: what vLLM's config reads, no weights."""
    arch, fields = build_model.SHAPES[shape]
    fields = {**fields, "vocab_size": fields["vocab_size"] or 2048, **overrides}
    out = tmp_path / f"{shape}-{len(list(tmp_path.iterdir()))}"
    out.mkdir()
    import transformers

    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[arch]
    cls(**fields).to_json_file(out / "config.json")
    for name in TOKENIZER_FILES:
        shutil.copy(ROOT / "build" / "tiny-llama" / name, out / name)
    # as tools/build_model.py writes it: the tokenizer's length is the model's
    tokenizer_length(out, fields["max_position_embeddings"])
    return str(out)


def tokenizer_length(model, tokens: int) -> None:
    path = model / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "model_max_length": tokens}))


def preflight(model: str, flags: list[str], kv_gib: int) -> str | None:
    """Our verdict for a KV cache of `kv_gib` (VLLM_CPU_KVCACHE_SPACE): None, or the error."""
    work = workload([model, *flags], model, {})
    try:
        pl.plan(
            Limits("v2", (0, 1), None, None, cores=2), work, {"VLLM_CPU_KVCACHE_SPACE": str(kv_gib)}
        )
    except ConfigError as e:
        return str(e)
    return None


VLLM_CHECK = r"""
import json, sys
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
from vllm.v1.core.kv_cache_utils import check_enough_kv_cache_memory
from vllm.v1.kv_cache_interface import FullAttentionSpec

try:  # 0.32: the layout is resolved by the engine core before its check
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts, resolve_kv_cache_layout)
except ImportError:
    resolve_kv_cache_layout = None

out = []
for model, args, kv_gib in json.load(sys.stdin):
    cfg = EngineArgs(model=model, **args).create_engine_config()
    mc, pc, cc = cfg.model_config, cfg.parallel_config, cfg.cache_config
    dtype = mc.dtype if cc.cache_dtype == "auto" else STR_DTYPE_TO_TORCH_DTYPE[cc.cache_dtype]
    spec = FullAttentionSpec(block_size=cc.block_size, num_kv_heads=mc.get_num_kv_heads(pc),
                             head_size=mc.get_head_size(), dtype=dtype)
    specs = {f"model.layers.{i}.self_attn.attn": spec for i in range(mc.get_num_layers(pc))}
    if resolve_kv_cache_layout is not None:
        layouts = [[x.name for x in get_supported_kv_cache_layouts([CPUAttentionBackend])]]
        resolve_kv_cache_layout(cfg, layouts, list(specs.values()))
    try:
        check_enough_kv_cache_memory(cfg, specs, kv_gib << 30)
        out.append([mc.max_model_len, None])
    except ValueError as e:
        out.append([mc.max_model_len, str(e)])
print("RESULT " + json.dumps(out))
"""


def vllm_verdicts(cases: list[tuple[str, dict, int]]) -> list[tuple[int, str | None]]:
    """(max_model_len, vLLM's refusal or None) for each (model, EngineArgs fields, KV GiB), from
    the installed vLLM in a process of its own (its config sets process-wide state)."""
    r = subprocess.run(
        [sys.executable, "-c", VLLM_CHECK],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=300,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "VLLM_LOGGING_LEVEL": "ERROR"},
    )
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    return [tuple(v) for v in json.loads(lines[-1][len("RESULT ") :])]


def test_refuses_only_what_vllm_refuses_and_suggests_a_length_vllm_starts_with(tmp_path):
    llama = shape_dir(tmp_path, "llama-3.2-1b")  # 131072 tokens x 32 KiB = 4 GiB
    qwen = shape_dir(tmp_path, "qwen2.5-0.5b")  # 32768 x 12 KiB = 384 MiB
    short_tok = shape_dir(tmp_path, "llama-3.2-1b")
    tokenizer_length(tmp_path / short_tok, 16384)
    # Fields of a type vLLM reads its own way, which it starts with: 2048.0 is a 2048-token length
    # to its min(), a 0 KV head count 1 per worker. The context is unknown to us: nothing checked.
    float_length = shape_dir(tmp_path, "llama-3.2-1b", max_seq_len=2048.0)
    no_kv_heads = shape_dir(tmp_path, "llama-3.2-1b", num_key_value_heads=0)
    # (model, our flags, vLLM's EngineArgs fields, KV GiB, whether we refuse)
    cases = [
        (llama, [], {}, 1, True),
        # exactly 4 GiB: vLLM 0.32 holds a block back and refuses; the edge is left to vLLM
        (llama, [], {}, 4, False),
        (llama, [], {}, 5, False),
        (llama, ["--max-model-len", "32k"], {"max_model_len": 32000}, 1, False),
        (llama, ["--max-model-len", "40000"], {"max_model_len": 40000}, 1, True),
        (llama, ["--kv-cache-dtype", "fp8"], {"kv_cache_dtype": "fp8"}, 1, True),
        (llama, ["--kv-cache-dtype", "fp8"], {"kv_cache_dtype": "fp8"}, 3, False),
        (short_tok, [], {}, 1, False),  # the tokenizer's 16384 tokens: 512 MiB
        (qwen, [], {}, 1, False),
        (float_length, [], {}, 1, False),
        (no_kv_heads, [], {}, 1, False),
    ]
    ours = [preflight(m, flags, kv) for m, flags, _, kv, _ in cases]
    assert [bool(x) for x in ours] == [c[-1] for c in cases], ours
    # each refusal's suggestion, as vLLM would be started with it
    suggested = []
    for (model, flags, args, kv, _), said in zip(cases, ours):
        if said:
            assert "\n" not in said and said.startswith("the model's")
            fits = int(re.search(r"--max-model-len (\d+) or less", said).group(1))
            assert preflight(model, [*flags, "--max-model-len", str(fits)], kv) is None
            suggested.append((model, {**args, "max_model_len": fits}, kv))
    got = vllm_verdicts([(m, args, kv) for m, _, args, kv, _ in cases] + suggested)
    for case, said, (length, refused) in zip(cases, ours, got):
        if said:  # never one vLLM would have started
            assert refused and "KV cache is needed" in refused, (case, said)
        ctx = cx.context(resolve([case[0], *case[1]]), model_dir(case[0]))
        if case[0] in (float_length, no_kv_heads):
            assert ctx is None and refused is None, (case, length, refused)
        else:
            assert length >= ctx.tokens  # a lower bound
    for case, (length, refused) in zip(suggested, got[len(cases) :]):
        assert refused is None, (case, refused)


def test_the_message_names_the_numbers_and_both_fixes(tmp_path):
    llama = shape_dir(tmp_path, "llama-3.2-1b")
    work = workload([llama], llama, {})  # no weights here: memory.max 4 GiB gives 1 GiB of KV
    with pytest.raises(ConfigError) as e:
        pl.plan(Limits("v2", (0, 1), None, 4 * GiB, cores=2), work, {})
    least = -(-pl.least_memory(work, 5) // GiB)
    assert str(e.value) == (
        "the model's 131072-token context (config.json max_position_embeddings) needs a 4.0 GiB "
        "KV cache for one request (32 KiB/token: 16 layers x 8 KV heads x 64 x K,V x 2 B); the KV "
        "cache is 1 GiB (from memory.max 4.0 GiB): pass --max-model-len 31744 or less, or raise "
        "the memory limit (docker run --memory, compose mem_limit, k8s limits.memory) to at "
        f"least {least} GiB (a 5 GiB KV cache)"
    )
    assert len("entrypoint.py: " + str(e.value)) < 400  # one line on a terminal or a log view
    # the fix it names works: that limit gives a KV cache that holds it
    assert pl.plan(Limits("v2", (0, 1), None, least * GiB, cores=2), work, {}).kv_gib >= 5
    with pytest.raises(ConfigError, match=r"\(no memory limit\): .* set VLLM_CPU_KVCACHE_SPACE=5$"):
        pl.plan(Limits("v2", (0, 1), None, None, cores=2), work, {})


@pytest.mark.parametrize(
    "overrides, flags",
    [
        ({"sliding_window": 4096}, []),  # llama with a window: vLLM needs less
        ({}, ["--max-model-len", "auto"]),  # vLLM fits the length to the memory
        ({}, ["--max-model-len", "-1"]),
        ({}, ["--hf-overrides", '{"max_position_embeddings": 1024}']),
        ({}, ["--kv-cache-memory-bytes", "8G"]),
        ({}, ["--hf-config-path", "/elsewhere"]),
        ({"layer_types": ["sliding_attention"] * 16, "sliding_window": None}, []),
    ],
)
def test_nothing_is_checked_where_the_need_is_not_known_for_sure(tmp_path, overrides, flags):
    llama = shape_dir(tmp_path, "llama-3.2-1b", **overrides)
    assert workload([llama, *flags], llama, {}).context is None
    assert preflight(llama, flags, 1) is None


def test_not_a_local_model_or_not_a_known_architecture(tmp_path):
    assert cx.context(resolve(["org/model"]), model_dir("org/model")) is None
    other = tmp_path / "m"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "gemma3", "num_hidden_layers": 2}))
    assert cx.context(resolve([str(other)]), model_dir(str(other))) is None
    (other / "config.json").write_text("[1, 2]")  # not an object: not read
    assert cx.context(resolve([str(other)]), model_dir(str(other))) is None


def test_parallel_workers_hold_a_share_of_the_heads_and_layers(tmp_path):
    llama = shape_dir(tmp_path, "llama-3.2-1b")
    one = cx.context(resolve([llama]), model_dir(llama))
    tp = cx.context(resolve([llama, "-tp", "2"]), model_dir(llama))
    pp = cx.context(resolve([llama, "--pipeline-parallel-size", "3"]), model_dir(llama))
    # 8 KV heads under 16-way tensor parallelism: replicated, 1 each
    many = cx.context(resolve([llama, "-tp", "16"]), model_dir(llama))
    assert (one.per_token, tp.per_token) == (32 * 1024, 16 * 1024)
    assert pp.layers == 5 and many.kv_heads == 1


def test_given_max_model_len_is_read_as_vllm_reads_it():
    from vllm.utils.argparse_utils import human_readable_int_or_auto

    for value in ("4096", "4k", "4K", "25.6k", "1.5K", "2M", "1g", "auto", "-1", "x", "4096.5"):
        try:
            theirs = human_readable_int_or_auto(value)
        except Exception:  # noqa: BLE001 - vLLM refuses it itself: nothing for us to check
            theirs = None
        assert cx.max_model_len(value) == (None if theirs == -1 else theirs), value


def test_serve_refuses_in_one_line_and_64_before_anything_starts(tmp_path):
    from .test_bad_inputs import entrypoint, refused

    llama = shape_dir(tmp_path, "llama-3.2-1b")
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}  # whatever this host's memory limit
    refused(entrypoint(tmp_path, "serve", llama, env=env), "pass --max-model-len 31744 or less")
    r = entrypoint(tmp_path, "plan", llama, "--max-model-len", "31744", env=env)
    assert r.returncode == 0 and "VLLM_CPU_KVCACHE_SPACE=1 (yours)" in r.stdout, r.stdout
