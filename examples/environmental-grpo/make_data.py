"""Regenerate the environmental-grpo example's data (deterministic; the outputs are committed).

python examples/environmental-grpo/make_data.py

Questions "What is a + b?" for two-digit a and b, with their answers: 64 rows to train on
(train.jsonl), 32 held out (eval.jsonl), rows for the calculator environment (calculator.py).

sft.jsonl is the starting point's SFT data (sft.yaml), on other sums: a third of the
conversations call the calculator and, given its result, say "Done."; the others answer at
once with the right sum. A tiny model cannot add two-digit numbers in its head, so what it
learns from the direct answers is their form, and its own are nearly always wrong; the
calculator is always right. It starts out calling the tool about a third of the time, and
GRPO has to find that the tool pays: the mean reward rises from about 0.3 towards 1.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
CALL = {"name": "calculator", "arguments": {}}


def question(a: int, b: int) -> str:
    return f"What is {a} + {b}?"


def sft_row(a: int, b: int, use_tool: bool) -> dict[str, object]:
    user = {"role": "user", "content": question(a, b)}
    if not use_tool:
        return {"messages": [user, {"role": "assistant", "content": str(a + b)}]}
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": CALL}],
    }
    result = {"role": "tool", "content": str(a + b)}
    return {"messages": [user, call, result, {"role": "assistant", "content": "Done."}]}


def write(path: Path, data: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in data))


if __name__ == "__main__":
    rng = random.Random(8)
    pairs = rng.sample([(a, b) for a in range(10, 100) for b in range(10, 100)], 96 + 384)
    rows = [{"prompt": question(a, b), "answer": a + b} for a, b in pairs[:96]]
    write(HERE / "train.jsonl", rows[:64])
    write(HERE / "eval.jsonl", rows[64:])
    write(HERE / "sft.jsonl", [sft_row(a, b, i % 3 == 0) for i, (a, b) in enumerate(pairs[96:])])
