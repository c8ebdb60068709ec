"""Regenerate the classification example's data (deterministic; the outputs are committed).

python examples/classification/make_data.py

Each text asks for a sum, a difference or a product of two digits; its label is the operation.
All 300 questions, shuffled: 240 to train on (train.jsonl), 60 held out (eval.jsonl). The
operation sits in the middle of the text and every text starts alike, so a classifier that
reads only the first token cannot beat chance: it must pool where the whole text was read.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
OPERATIONS = {"+": "addition", "-": "subtraction", "*": "multiplication"}


def rows() -> list[dict[str, str]]:
    return [
        {"text": f"What is {a} {op} {b}?", "label": label}
        for op, label in OPERATIONS.items()
        for a in range(10)
        for b in range(10)
    ]


def write(path: Path, data: list[dict[str, str]]) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in data))


if __name__ == "__main__":
    all_rows = rows()
    random.Random(5).shuffle(all_rows)
    write(HERE / "eval.jsonl", all_rows[:60])
    write(HERE / "train.jsonl", all_rows[60:])
