"""A tiny Hugging Face Llama made here, for servers and tests: nothing is downloaded.

The tokenizer is a byte-level BPE trained with `tokenizers` on the shipped example data, its
chat template the ChatML the trainer renders (``<|bos|>`` then ``<|im_start|>role\\n…<|im_end|>\\n``
per message). The model is a `transformers` LlamaForCausalLM from a config, seeded, float32.
Head size 64: vLLM's CPU attention rejects smaller heads ("Unsupported CPU attention
configuration" at 16).

Run in an environment that has torch, transformers and tokenizers (a server's)::

    python -m halo.rollout.tiny OUT [--data FILE ...]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from halo.atomic import staged_dir

SPECIALS = ("<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>")
# The trainer's rendering (halo/train/tokenizer.py render_chat) as a Jinja template: what the
# server applies to chat requests must be what the model was trained on.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ARCH = {
    "hidden_size": 256,
    "num_attention_heads": 4,  # head_dim 64
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}
VOCAB = 640


def texts(files: Sequence[Path]) -> Iterator[str]:
    """Every string value of every JSONL row: the corpus the BPE merges are learned from."""

    def walk(v: object) -> Iterator[str]:
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            for x in v.values():
                yield from walk(x)
        elif isinstance(v, list):
            for x in v:
                yield from walk(x)

    for f in files:
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                yield from walk(json.loads(line))


def build_tokenizer(files: Sequence[Path]):  # -> transformers.PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts(files)), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|im_end|>",  # a chat turn ends the answer: generation stops there
        pad_token="<|pad|>",
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def build(out: Path, files: Sequence[Path], seed: int = 0) -> Path:
    """Write a servable model folder (config, safetensors, tokenizer with template) to ``out``."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tok = build_tokenizer(files)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
        **ARCH,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with staged_dir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        GenerationConfig(
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        ).save_pretrained(tmp)
        tmp.chmod(0o755)
    return out


def shipped_data(repo: Path) -> list[Path]:
    return sorted((repo / "examples").glob("*/train.jsonl"))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m halo.rollout.tiny")
    p.add_argument("out", type=Path)
    p.add_argument("--data", type=Path, nargs="*", help="JSONL files (default: examples/*)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from halo.paths import find_repo

    files = args.data or shipped_data(find_repo())
    print(build(args.out, files, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
