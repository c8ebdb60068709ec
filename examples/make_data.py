"""Regenerate the tiny example data sets (deterministic; the outputs are committed).

python examples/make_data.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent


def sft_rows(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for i in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        msgs = [
            {"role": "user", "content": f"What is {a} + {b}?"},
            {"role": "assistant", "content": f"{a} + {b} = {a + b}."},
        ]
        if i % 4 == 0:
            msgs.insert(0, {"role": "system", "content": "You add small numbers."})
        rows.append({"messages": msgs})
    return rows


def grpo_rows(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        right = a + b
        wrong = rng.sample([x for x in range(19) if x != right], 3)
        comps = [{"text": f"{right}", "reward": 1.0}] + [
            {"text": f"{w}", "reward": 0.0} for w in wrong
        ]
        rng.shuffle(comps)
        rows.append({"prompt": f"What is {a} + {b}?", "completions": comps})
    return rows


def dpo_rows(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        wrong = rng.choice([x for x in range(19) if x != a + b])
        rows.append({"prompt": f"What is {a} + {b}?", "chosen": f"{a + b}", "rejected": f"{wrong}"})
    return rows


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


if __name__ == "__main__":
    write(HERE / "sft" / "train.jsonl", sft_rows(random.Random(0), 64))
    write(HERE / "grpo" / "train.jsonl", grpo_rows(random.Random(1), 32))
    write(HERE / "dpo" / "train.jsonl", dpo_rows(random.Random(2), 32))
