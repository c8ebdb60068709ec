"""Environments that misbehave on purpose, for the environmental-grpo tests (loaded by file
path, as a user's environment next to their config would be)."""

from __future__ import annotations

from typing import Any

from halo.train.methods.environment import Action, Step


class Faulty:
    """What a row's ``fault`` says goes wrong: the step raises, the step answers something
    that is no step, the reward is not a number, reset raises; or nothing (a normal episode
    that ends after the first answer with reward 1)."""

    def reset(self, row: dict[str, Any]) -> str:
        self.fault = row.get("fault", "")
        if self.fault == "reset":
            raise RuntimeError("the task server is down")
        return str(row["prompt"])

    def step(self, action: Action) -> Any:
        if self.fault == "raises":
            raise KeyError("score")
        if self.fault == "malformed":
            return (None, 1.0)
        if self.fault == "reward":
            return Step(None, "high", True)  # type: ignore[arg-type]
        return Step(None, 1.0, True)


class Endless:
    """Never done: every answer gets another question (the turn and token limits end it)."""

    def reset(self, row: dict[str, Any]) -> str:
        return str(row["prompt"])

    def step(self, action: Action) -> Step:
        return Step("And what is 1 + 1?", 0.25, False)
