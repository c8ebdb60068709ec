"""Regenerate the online GRPO example's data (deterministic; the outputs are committed).

python examples/online-grpo/make_data.py

Every sum a + b of two digits, each once: 80 to train on (train.jsonl), 20 held out
(eval.jsonl), never trained on, neither here nor by the SFT that makes the starting point.
The completion is the reference the exact-match reward compares with: ``a + b = c.``.

sft.jsonl is the starting point's SFT data (sft.yaml): the 80 training sums, each answered
right in four formats, the reference's among them. Why: exact match on the reference rewards
a format as well as a sum. A model that writes the reference's format a quarter of the time
has something to learn from GRPO that carries over to prompts it never practised (answer in
this format), where learning one sum teaches nothing about another. The held-out reward
then measures whether that carries over. Trained on the reference format only, the model
gets a held-out sum right or wrong for good, and GRPO can only reshuffle which training
sums it has memorised.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent

# Right answers in several formats; the first is the reward's reference.
FORMATS = (
    "{a} + {b} = {c}.",
    "{c}",
    "The sum is {c}.",
    "{a} plus {b} is {c}.",
)


def rows() -> list[dict[str, str]]:
    return [
        {"prompt": f"What is {a} + {b}?", "completion": FORMATS[0].format(a=a, b=b, c=a + b)}
        for a in range(10)
        for b in range(10)
    ]


def sft_rows(train: list[dict[str, str]], rng: random.Random) -> list[dict[str, str]]:
    """Each training sum in every format, shuffled."""
    out = []
    for row in train:
        a, b = (int(x) for x in row["prompt"].removeprefix("What is ").rstrip("?").split(" + "))
        out += [
            {"prompt": row["prompt"], "completion": f.format(a=a, b=b, c=a + b)} for f in FORMATS
        ]
    rng.shuffle(out)
    return out


def write(path: Path, data: list[dict[str, str]]) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in data))


if __name__ == "__main__":
    all_rows = rows()
    random.Random(3).shuffle(all_rows)
    held_out, train = all_rows[:20], all_rows[20:]
    write(HERE / "eval.jsonl", held_out)
    write(HERE / "train.jsonl", train)
    write(HERE / "sft.jsonl", sft_rows(train, random.Random(4)))
