"""Reward functions that misbehave, for the online GRPO failure tests."""

from __future__ import annotations

from typing import Any


def raises(completion: str, row: dict[str, Any]) -> float:
    return float(row["no such key"])
