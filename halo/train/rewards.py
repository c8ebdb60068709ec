"""Reward functions online GRPO can name in its config (``rollout.reward: module:function``).

A reward is ``f(completion: str, row: dict) -> float``: the sampled text and the dataset row
its prompt came from, so it can read the row's reference (``completion`` in the
prompt/completion format), test cases, or anything else the row carries.
"""

from __future__ import annotations

from typing import Any


def exact_match(completion: str, row: dict[str, Any]) -> float:
    """1.0 when the completion, stripped, is exactly the row's reference; else 0.0."""
    return 1.0 if completion.strip() == str(row["completion"]).strip() else 0.0
