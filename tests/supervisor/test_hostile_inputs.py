"""Hostile files behind entrypoint.py's inputs: a --config YAML whose scalars the YAML library
cannot build, and a local model's config.json of wrongly typed fields. Through `serve`, `plan`
and `grace-period` against the fake vLLM, each ends in one line and a documented exit code, never
a traceback, and leaves nothing in its TMPDIR (each case its own). Hypothesis fuzzes both parsers
in-process (FUZZ_EXAMPLES examples, as test_fuzz_inputs.py)."""

from __future__ import annotations

import json
import math
import pathlib
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_intel.supervisor import context as cx
from vllm_intel.supervisor import vllm_args
from vllm_intel.supervisor.errors import ConfigError
from vllm_intel.supervisor.workload import model_dir

from .test_bad_inputs import entrypoint
from .test_fuzz_inputs import DEFAULT_EXAMPLES


def one_line(r, code: int, message: str) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert len(lines) == 1 and lines[0].startswith("entrypoint.py: "), r.stderr
    assert message in lines[0] and len(lines[0]) < 400, lines[0]
    assert "Traceback" not in r.stdout + r.stderr and "fake vllm argv" not in r.stdout
    return lines[0]


def left(tmp: pathlib.Path) -> set[str]:
    return {p.name for p in tmp.iterdir()}


# -- 1. --config YAML the loader cannot build ---------------------------------------------------

YAML_CASES = [
    ("date.yaml", "x: 2024-02-30\n", "'2024-02-30' is not a valid timestamp"),
    ("port-date.yaml", "port: 2024-02-30\n", "'2024-02-30' is not a valid timestamp"),
    ("zone.yaml", "x: 2001-12-14 21:59:43.10 +99:00\n", "is not a valid timestamp"),
    ("stamp.yaml", "x: !!timestamp soon\n", "'soon' is not a valid timestamp"),
    ("huge.yaml", "x: " + "9" * 5000 + "\n", "(5000 chars) is not a valid int"),
    ("float.yaml", "x: !!float abc\n", "'abc' is not a valid float"),
    ("empty-int.yaml", 'x: !!int ""\n', "'' is not a valid int"),
    ("base.yaml", "x: !!int 0b\n", "'0b' is not a valid int"),
    ("sexagesimal.yaml", "shutdown-timeout: !!int 1:a\n", "'1:a' is not a valid int"),
    ("bool.yaml", "headless: !!bool maybe\n", "'maybe' is not a valid bool"),
    ("date-key.yaml", "hf-overrides: {2024-01-01: 1}\n", "hf-overrides: a key JSON cannot"),
]


@pytest.mark.parametrize("command", ["serve", "plan", "grace-period"])
@pytest.mark.parametrize("name, content, message", YAML_CASES)
def test_a_yaml_value_the_loader_cannot_build_is_one_line_and_64(
    tmp_path, command, name, content, message
):
    (tmp_path / "model").mkdir()
    (tmp_path / name).write_text(content)
    before = left(tmp_path)
    r = entrypoint(tmp_path, command, "./model", "--config", name)
    line = one_line(r, 64, message)
    assert line.startswith(f"entrypoint.py: --config {name}: "), line
    assert left(tmp_path) == before


@pytest.mark.parametrize(
    "content, message",
    [
        ("x: !!binary ü\n", "failed to convert base64"),  # PyYAML's own error, now named
        ("x: !foo bar\n", "could not determine a constructor for the tag '!foo'"),
        ("x: !!python/name:os.system x\n", "could not determine a constructor"),
        ("a: &x {p: 1}\nb:\n  <<: *x\n", "alias *x (YAML aliases are refused)"),
    ],
)
def test_the_loaders_own_refusals_name_the_problem(tmp_path, content, message):
    (tmp_path / "c.yaml").write_text(content)
    one_line(entrypoint(tmp_path, "grace-period", "--config", "c.yaml"), 64, message)


_scalar = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        ["2024-02-30", "2001-12-14t21:59:43.10-99:00", "0x", "0b", "0o9", "1:2:a", "", "_", "."]
        + ["1e999", ".nan", "~", "0000-00-00", "9999-12-31 23:59:60", "[1", "<<", "1_0", "?"]
    ),
)
_tag = st.sampled_from(
    ["", "!!int ", "!!float ", "!!bool ", "!!timestamp ", "!!binary ", "!!null ", "!!str "]
    + ["!!set ", "!!omap ", "!!pairs ", "!!map ", "!!seq ", "!foo ", "&a ", "*a "]
)
_key = st.sampled_from(["port", "x", "shutdown-timeout", "headless", "hf-overrides", "<<", "1"])
_line = st.builds(
    lambda key, tag, value, nested: (
        f"{key}: {{{tag}{value}}}" if nested else f"{key}: {tag}{value}"
    ),
    _key,
    _tag,
    _scalar,
    st.booleans(),
)


@settings(
    max_examples=DEFAULT_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(lines=st.lists(_line, max_size=4))
def test_fuzz_config_files_resolve_or_refuse_in_one_line(tmp_path, lines):
    path = tmp_path / "c.yaml"
    path.write_text("\n".join(lines) + "\n")
    try:
        vllm_args.resolve(["m", "--config", str(path)])
    except ConfigError as e:
        assert "\n" not in str(e)


# -- 2. a local model's config.json of wrongly typed fields --------------------------------------

# A Llama-3.2-1B shape: one request of its 131072 tokens needs a 4 GiB KV cache, more than the
# 1 GiB VLLM_CPU_KVCACHE_SPACE below, so the plan refuses it while its context is known.
LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 2048,
    "head_dim": 64,
    "max_position_embeddings": 131072,
}
KV_1_GIB = {"VLLM_CPU_KVCACHE_SPACE": "1"}
# Fields the supervisor read to a traceback, or to a refusal of what vLLM starts (true, 2048.0
# and a 0 KV head count, as vLLM 0.32.0 reads them: test_context.py asks vLLM); each leaves the
# context unknown now, so the plan passes.
CONFIG_CASES = {
    "model_type list": {"model_type": ["llama"]},
    "model_type mapping": {"model_type": {"llama": 1}},
    "layer_types number": {"layer_types": 5},
    "layer_types bool": {"layer_types": True},
    "layers past a float": {"num_hidden_layers": 10**400},
    "length past a float": {"max_position_embeddings": 10**400},
    "length as a float": {"max_seq_len": 2048.0},
    "length as true": {"n_positions": True},
    "no KV heads": {"num_key_value_heads": 0},
    "tokenizer length as a float": {"tokenizer": {"model_max_length": 2048.0}},
}


def hostile_model(tmp: pathlib.Path, fields: dict) -> str:
    model = tmp / "model"
    model.mkdir()
    tokenizer = fields.pop("tokenizer", None)
    (model / "config.json").write_text(json.dumps({**LLAMA, **fields}))
    if tokenizer is not None:
        (model / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return "./model"


def test_the_shape_without_a_hostile_field_is_refused(tmp_path):
    """The control: the same model, each field as vLLM reads it, is checked and refused."""
    model = hostile_model(tmp_path, {})
    r = entrypoint(tmp_path, "plan", model, env=KV_1_GIB)
    one_line(r, 64, "the model's 131072-token context (config.json max_position_embeddings)")


@pytest.mark.parametrize(
    "fields",
    [
        {"max_seq_len": float("inf")},
        {"seq_length": float("nan")},
        {"max_seq_len": 1e30},
        {"tokenizer": {"model_max_length": 10**30}},  # what transformers writes for "no limit"
        {"tokenizer": {"model_max_length": float("nan")}},
    ],
)
def test_a_length_vllms_min_never_picks_keeps_the_context_known(tmp_path, fields):
    """vLLM's min() passes over a float above the others, NaN and inf included: still refused."""
    model = hostile_model(tmp_path, dict(fields))
    one_line(entrypoint(tmp_path, "plan", model, env=KV_1_GIB), 64, "131072-token context")


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_a_wrongly_typed_config_field_leaves_the_context_unknown(tmp_path, case):
    model = hostile_model(tmp_path, dict(CONFIG_CASES[case]))
    before = left(tmp_path)
    r = entrypoint(tmp_path, "plan", model, env=KV_1_GIB)
    assert r.returncode == 0 and r.stdout.startswith("plan: "), (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert cx.context(vllm_args.resolve([model]), model_dir(str(tmp_path / "model"))) is None
    # serve gets past the plan too: a port held by another server then stops it before vLLM
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = str(other.getsockname()[1])
        r = entrypoint(tmp_path, "serve", model, "--port", port, env=KV_1_GIB)
    one_line(r, 64, f"cannot listen on port {port}")
    assert left(tmp_path) == before  # the run directory made and removed


_json_value = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.sampled_from([10**400, 2**63, 2**63 - 1, 0, 1, 131072]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=8),
        st.sampled_from(["llama", "qwen2", "full_attention", "sliding_attention"]),
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
_fields = st.sampled_from(
    [*LLAMA, *cx.LENGTH_KEYS, "layer_types", "sliding_window", "use_sliding_window"]
)


@settings(
    max_examples=DEFAULT_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    fields=st.dictionaries(_fields, _json_value, max_size=4),
    tokenizer=st.one_of(st.none(), _json_value),
    flags=st.sampled_from([[], ["-tp", "2"], ["--max-model-len", "4k"], ["-pp", "3"]]),
)
def test_fuzz_config_json_gives_a_context_or_none(tmp_path, fields, tokenizer, flags):
    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({**LLAMA, **fields}))
    (model / "tokenizer_config.json").write_text(json.dumps({"model_max_length": tokenizer}))
    ctx = cx.context(vllm_args.resolve([str(model), *flags]), model_dir(str(model)))
    if ctx is not None:
        assert ctx.tokens > 0 and ctx.per_token > 0
        assert math.isfinite(ctx.needed / 2**30) and ctx.shape() and ctx.fitting(2**30) >= 0
