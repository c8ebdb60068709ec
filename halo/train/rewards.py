"""Reward functions online GRPO can name in its config (``grpo.reward: module:function``).

A reward is ``f(completion: str, row: dict) -> float``: the sampled text and the dataset row
its prompt came from (so it can read the row's reference answer, test cases, ...).
"""

from __future__ import annotations

import re
from typing import Any

# The first number in an answer; a sign and one decimal point allowed.
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def exact_match(completion: str, row: dict[str, Any]) -> float:
    """1.0 when the completion, stripped, is exactly the row's ``answer``; else 0.0."""
    return 1.0 if completion.strip() == str(row["answer"]).strip() else 0.0


def first_number_matches(completion: str, row: dict[str, Any]) -> float:
    """1.0 when the first number in the completion equals the row's ``answer``."""
    m = NUMBER.search(completion)
    return 1.0 if m and m.group() == str(row["answer"]).strip() else 0.0
