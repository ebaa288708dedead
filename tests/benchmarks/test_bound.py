"""bench/bound.py: the weight bytes a decode step reads, from checkpoints written here by torch and
safetensors, the host's read bandwidth, and runtime's rows against the bound."""

from __future__ import annotations

import json
import math
import struct

import pytest
import torch
from safetensors.torch import save_file

from bench import bound, runtime


def checkpoint(tmp_path, tied: bool):
    tensors = {
        "model.embed_tokens.weight": torch.zeros(100, 8, dtype=torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.zeros(16, 8, dtype=torch.bfloat16),
        "model.norm.weight": torch.zeros(8, dtype=torch.float32),
    }
    if not tied:
        tensors["lm_head.weight"] = torch.zeros(100, 8, dtype=torch.bfloat16)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": tied}))
    return {k: v.numel() * v.element_size() for k, v in tensors.items()}


@pytest.mark.parametrize("tied", [True, False])
def test_a_step_reads_every_weight_once_and_an_untied_input_embedding_not_at_all(tmp_path, tied):
    sizes = checkpoint(tmp_path, tied)
    embedding = sizes["model.embed_tokens.weight"]
    expected = sum(sizes.values()) - (0 if tied else embedding)
    assert bound.bytes_per_step(tmp_path) == expected


def test_the_built_in_model_as_safetensors_itself_counts_it(tiny_model):
    from safetensors import safe_open

    total = 0
    for f in sorted(tiny_model.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for name in st.keys():
                t = st.get_tensor(name)
                total += t.numel() * t.element_size()
    config = json.loads((tiny_model / "config.json").read_text())
    assert config.get("tie_word_embeddings", False), "the count below assumes a tied model"
    assert bound.bytes_per_step(tiny_model) == total


def test_a_hostile_header_is_refused_before_it_is_read(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="header"):
        bound.bytes_per_step(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no safetensors"):
        bound.bytes_per_step(tmp_path)


def test_read_bandwidth_is_a_rate_and_leaves_torchs_threads_as_they_were():
    before = torch.get_num_threads()
    bw = bound.read_bandwidth(mib=8, repeats=3, threads=1)
    assert math.isfinite(bw) and bw > 1e8, bw  # > 0.1 GB/s: any machine reads faster
    assert torch.get_num_threads() == before


def test_runtime_rows_put_ours_against_n_streams_times_the_bound():
    loads = {"1 stream": (1, 48), "4 streams": (4, 48), "16 streams": (16, 24)}
    tok_s = {"1 stream": [10.0, 12.0], "4 streams": [30.0, None], "16 streams": [50.0, 60.0]}
    got = {
        "loads": loads,
        "got": {
            ("ours", k): [{"ok": v is not None, "tok_s": v} for v in vs] for k, vs in tok_s.items()
        },
        "bandwidth": 40e9,
        "step_bytes": 10**9,
    }
    rows = runtime.bound_rows("q, noquota", got)
    assert [r.figure for r in rows] == [
        "q, noquota, 1 stream: ours vs the bandwidth bound",
        "q, noquota, 4 streams: ours vs the bandwidth bound",
    ]
    one, four = rows
    assert one.alt == [40.0, 40.0] and one.ratio == [0.25, 0.30]
    assert four.ours == [30.0] and four.ratio == [30.0 / 160.0]  # the failed round left out
    assert all(r.goal == runtime.BOUND_GOAL for r in rows)
    assert runtime.bound_rows("q", {"loads": loads, "got": {}}) == []  # no bandwidth: no rows
