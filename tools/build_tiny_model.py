"""Build the project's built-in tiny model, fully offline and deterministically.

A random-weight LlamaForCausalLM (hidden 64, 2 layers, 2 heads, 1 KV head: head size 32, the
smallest vLLM's CPU attention accepts) with a byte-level BPE tokenizer trained on the Python
standard library's own sources, so nothing is fetched from a hub. ~1.5 MB, ~5 s. Used by the
tests, by `make run` / `entrypoint.py` with no arguments, and baked into the images.

    python tools/build_tiny_model.py OUT_DIR
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import sysconfig

VOCAB_SIZE = 2048
MAX_LEN = 8192
SEED = 1234
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus(limit: int = 400) -> list[str]:
    """Sorted stdlib sources: the same text, hence the same tokenizer, on every machine."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py"))[:limit]
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


def build(out: pathlib.Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=MAX_LEN,
    )
    fast.chat_template = CHAT_TEMPLATE

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=MAX_LEN,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)
    for f in out.iterdir():  # safetensors writes 0600; the images' non-root user must read it
        f.chmod(0o644)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--force", action="store_true", help="rebuild even if OUT/config.json exists")
    args = ap.parse_args(argv)
    if (args.out / "config.json").exists() and not args.force:
        print(f"tiny model already at {args.out}")
        return 0
    build(args.out)
    print(f"tiny model written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
