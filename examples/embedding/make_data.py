"""Regenerate the embedding example's data (deterministic; the outputs are committed).

python examples/embedding/make_data.py

Queries are questions about two digits ("What is 3 * 4?"), positives their worked answers
("3 * 4 = 12."), and the hard negative of each is the answer with the same digits under
another operation ("3 + 4 = 7."): it shares nearly every token with the positive, so only an
embedding that reads the operation tells them apart. All 300 questions, shuffled: 240 to
train on (train.jsonl), 60 held out (eval.jsonl) for recall@1 and recall@10.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def answer(a: int, op: str, b: int) -> str:
    return f"{a} {op} {b} = {OPERATIONS[op](a, b)}."


def rows(rng: random.Random) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for op in OPERATIONS:
        for a in range(10):
            for b in range(10):
                other = rng.choice([o for o in OPERATIONS if o != op])
                out.append(
                    {
                        "query": f"What is {a} {op} {b}?",
                        "positive": answer(a, op, b),
                        "negatives": [answer(a, other, b)],
                    }
                )
    return out


def write(path: Path, data: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in data))


if __name__ == "__main__":
    all_rows = rows(random.Random(6))
    random.Random(7).shuffle(all_rows)
    write(HERE / "eval.jsonl", all_rows[:60])
    write(HERE / "train.jsonl", all_rows[60:])
