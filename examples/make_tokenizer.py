"""Build the examples' tokenizer from the shipped data with `tokenizers` (deterministic).

python examples/make_tokenizer.py [OUT]     (default: examples/tokenizer)

A byte-level BPE trained on the example data and the chat template's own text, with the
ChatML special tokens and examples/chat_template.jinja as its chat template. The tests
rebuild it and compare it with the committed copy, so it stays what this script makes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = 400


def corpus() -> list[str]:
    """Every string in the example data, and the words the chat template writes."""
    texts: list[str] = []

    def walk(v: object) -> None:
        if isinstance(v, str):
            texts.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for path in sorted(HERE.glob("*/*.jsonl")):
        for line in path.read_text().splitlines():
            walk(json.loads(line))
    texts.append((HERE / "chat_template.jinja").read_text())
    return texts


def build(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=(HERE / "chat_template.jinja").read_text(),
    )
    hf.save_pretrained(str(out))


if __name__ == "__main__":
    build(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "tokenizer")
