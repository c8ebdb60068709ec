"""Reward functions online GRPO names in its config (``rollout.reward: package.module:function``),
how such a name is loaded, and how a group of completions is scored with it.

A reward is ``f(completion: str, row: dict) -> float``: the sampled text and the dataset row
its prompt came from, so it can read the row's reference (``completion`` in the
prompt/completion format), test cases, or anything else the row carries.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from typing import Any

from halo.errors import HaloError

Reward = Callable[[str, dict[str, Any]], float]


class RewardError(HaloError):
    """The reward function failed on a completion: the run stops (exit 1)."""

    exit_code = 1


def exact_match(completion: str, row: dict[str, Any]) -> float:
    """1.0 when the completion, stripped, is exactly the row's reference; else 0.0."""
    return 1.0 if completion.strip() == str(row["completion"]).strip() else 0.0


def load(path: str, key: str = "rollout.reward") -> Reward:
    module, _, name = path.partition(":")
    if not module or not name:
        raise HaloError(f"{key}: expected 'package.module:function', got {path!r}")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise HaloError(f"{key}: cannot load {path} ({exc})") from None
    if not callable(fn):
        raise HaloError(f"{key}: {path} is not callable")
    return fn


def score(
    fn: Reward,
    name: str,
    texts: Sequence[Sequence[str]],
    rows: Sequence[dict[str, Any]],
    where: Sequence[str],
) -> list[list[float]]:
    """Rewards per group; any failure of the user's function is one line naming the row."""
    out = []
    for group, row, at in zip(texts, rows, where, strict=True):
        rewards = []
        for text in group:
            try:
                r = float(fn(text, row))
            except Exception as exc:  # the user's function: whatever it raises is one line
                raise RewardError(
                    f"rollout.reward {name} raised {type(exc).__name__}: {exc} "
                    f"(completion {text[:60]!r} of {at})"
                ) from None
            if not math.isfinite(r):
                raise RewardError(f"rollout.reward {name} returned {r} for {at}")
            rewards.append(r)
        out.append(rewards)
    return out
