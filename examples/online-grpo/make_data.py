"""Regenerate the online GRPO example's prompts (deterministic; the outputs are committed).

python examples/online-grpo/make_data.py

Every sum a + b of two digits, each once: 80 to train on, 20 held out (never trained on) to
measure whether the policy gets better at sums it has not practised. The completion is the
reference the exact-match reward compares with, in the SFT example's answer style.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent


def rows() -> list[dict[str, str]]:
    return [
        {"prompt": f"What is {a} + {b}?", "completion": f"{a} + {b} = {a + b}."}
        for a in range(10)
        for b in range(10)
    ]


def write(path: Path, data: list[dict[str, str]]) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in data))


if __name__ == "__main__":
    all_rows = rows()
    random.Random(3).shuffle(all_rows)
    write(HERE / "eval.jsonl", all_rows[:20])
    write(HERE / "train.jsonl", all_rows[20:])
