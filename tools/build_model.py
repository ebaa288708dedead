"""Build one of the project's offline models, deterministically, with nothing fetched from a hub.

Random weights and a byte-level BPE tokenizer trained on the Python standard library's own
sources (the same text, hence the same files, on every machine). Shapes:

  tiny-llama    LlamaForCausalLM, hidden 64, 2 layers, 2 heads, 1 KV head (head size 32, the
                smallest vLLM's CPU attention accepts), fp32, ~1.5 MB, ~5 s. The fast tests,
                `make run` / `entrypoint.py` with no arguments, and the images use it.
  qwen2.5-0.5b  Qwen2ForCausalLM with Qwen2.5-0.5B's config: 24 layers, hidden 896, 14/2
                heads (GQA), MLP 4864, vocab 151936, tied embeddings, bf16: 494 M parameters,
                0.99 GB. The real-shape tier: drain and start-up defaults, `make bench`.
  llama-3.2-1b  LlamaForCausalLM with Llama-3.2-1B's config: 16 layers, hidden 2048, 32/8
                heads, MLP 8192, vocab 128256, tied embeddings, bf16: 1.24 B parameters, 2.5 GB.

A real shape's vocabulary is far larger than what the corpus trains: the ids past the trained
ones are ``<padN>`` entries of the BPE vocabulary (no merge produces them, so prompts never
encode to them), so every id the random weights sample decodes to text.

    python tools/build_model.py OUT_DIR [--shape NAME] [--force]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import sysconfig

TRAINED_VOCAB = 2048
SEED = 1234
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# name -> (architecture, config fields). vocab_size None: the trained tokenizer's size.
SHAPES: dict[str, tuple[str, dict]] = {
    "tiny-llama": (
        "llama",
        dict(
            vocab_size=None,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
            # vLLM's CPU backend serves fp32 configs in bf16 and warns per weight it casts
            torch_dtype="bfloat16",
        ),
    ),
    "qwen2.5-0.5b": (
        "qwen2",
        dict(
            vocab_size=151936,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            torch_dtype="bfloat16",
        ),
    ),
    "llama-3.2-1b": (
        "llama",
        dict(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            max_position_embeddings=131072,
            rope_theta=500000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            torch_dtype="bfloat16",
        ),
    ),
}


def corpus(limit: int = 400) -> list[str]:
    """Sorted stdlib sources: the same text, hence the same tokenizer, on every machine."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py"))[:limit]
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


def tokenizer(vocab_size: int | None, max_len: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TRAINED_VOCAB,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    if vocab_size is not None:
        data = json.loads(tok.to_str())
        vocab = data["model"]["vocab"]
        if vocab_size < len(vocab):
            raise SystemExit(f"vocab_size {vocab_size} < the trained {len(vocab)}")
        # ASCII only: the byte-level decoder maps printable ASCII to itself. The last id is
        # <|endoftext|>, which Qwen2's tokenizer class adds when it lacks one (one id past the
        # model's vocabulary otherwise).
        vocab.update({f"<pad{i}>": i for i in range(len(vocab), vocab_size - 1)})
        tok = Tokenizer.from_str(json.dumps(data))
        tok.add_special_tokens(["<|endoftext|>"])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=max_len,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build(out: pathlib.Path, shape: str = "tiny-llama") -> None:
    import torch
    import transformers

    arch, fields = SHAPES[shape]
    fields = dict(fields)
    fast = tokenizer(fields.pop("vocab_size"), fields["max_position_embeddings"])
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[arch]
    config = config_cls(
        vocab_size=len(fast),
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        **fields,
    )
    torch.manual_seed(SEED)
    dtype = getattr(torch, fields["torch_dtype"])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in its dtype: a 1 B model in fp32 would need 5 GB
    try:
        model = model_cls(config)
    finally:
        torch.set_default_dtype(previous)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="4GB")
    fast.save_pretrained(out)
    for f in out.iterdir():  # safetensors writes 0600; the images' non-root user must read it
        f.chmod(0o644)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny-llama")
    ap.add_argument("--force", action="store_true", help="rebuild even if OUT/config.json exists")
    args = ap.parse_args(argv)
    if (args.out / "config.json").exists() and not args.force:
        print(f"{args.shape} model already at {args.out}")
        return 0
    build(args.out, args.shape)
    print(f"{args.shape} model written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
