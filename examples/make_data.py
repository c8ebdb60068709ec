"""Regenerate the tiny example data sets (deterministic; the outputs are committed).

python examples/make_data.py        (then python examples/make_tokenizer.py)

Every format the trainer reads has an example: OpenAI messages (sft/train.jsonl), ShareGPT
with LLaMA-Factory-style tags (sft-mix/sharegpt.jsonl), prompt/completion in Parquet
(sft-mix/prompt_completion.parquet), tool calls with list-of-parts content
(sft-mix/tools.jsonl), preference pairs (dpo/), rewarded groups (grpo/).
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


def sharegpt_rows(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        turns = [
            {"from": "human", "value": f"What is {a} + {b}?"},
            {"from": "gpt", "value": f"{a} + {b} = {a + b}."},
        ]
        rows.append({"conversations": turns, "system": "You add small numbers."})
    return rows


def prompt_completion_rows(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append({"prompt": f"What is {a} + {b}?", "completion": f"{a} + {b} = {a + b}."})
    return rows


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def tool_rows(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for i in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "add", "arguments": json.dumps({"a": a, "b": b})},
        }
        msgs = [
            {"role": "user", "content": [{"type": "text", "text": f"Add {a} and {b}."}]},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": str(a + b)},
            {"role": "assistant", "content": [{"type": "text", "text": f"{a} + {b} = {a + b}."}]},
        ]
        rows.append({"messages": msgs, "tools": TOOLS})
    return rows


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def write_parquet(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path, compression="none")


if __name__ == "__main__":
    write(HERE / "sft" / "train.jsonl", sft_rows(random.Random(0), 64))
    write(HERE / "grpo" / "train.jsonl", grpo_rows(random.Random(1), 32))
    write(HERE / "dpo" / "train.jsonl", dpo_rows(random.Random(2), 32))
    write(HERE / "sft-mix" / "sharegpt.jsonl", sharegpt_rows(random.Random(3), 64))
    write(HERE / "sft-mix" / "tools.jsonl", tool_rows(random.Random(4), 16))
    write_parquet(
        HERE / "sft-mix" / "prompt_completion.parquet", prompt_completion_rows(random.Random(5), 64)
    )
