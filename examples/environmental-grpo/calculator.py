"""The environmental-grpo example's environment: arithmetic with a calculator tool.

Loaded by ``environment.path: calculator.py:Calculator`` (a file next to the config). An
episode asks the question of a row (``{"prompt": "What is 23 + 45?", "answer": 68}``). A model
turn either calls the calculator,
``<tool_call>{"name": "calculator", "arguments": {"expression": "23 + 45"}}</tool_call>``, and
gets its result as a tool message, or answers, which ends the episode: the answer is the last
number of that turn, or, when the turn has no number ("Done."), the calculator's last result.
Reward 1 if the answer is the row's, else 0. Without an expression the calculator evaluates
the question's own: the example model is too small to learn to copy numbers within the
minute CI gives it, so it learns *whether* to use the tool, not how to fill it in. A call the
calculator cannot read gets an error message as its result, as a real tool would answer.
"""

from __future__ import annotations

import operator
import re
from typing import Any

from halo.train.methods.environment import Action, Step

OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
EXPRESSION = re.compile(r"(-?\d+)\s*([-+*])\s*(-?\d+)")
NUMBER = re.compile(r"-?\d+")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "a + b, a - b or a * b (default: the question's)",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


def calculate(expression: str) -> str:
    match = EXPRESSION.search(expression)
    if match is None:
        return "error: expected an expression such as 12 + 34"
    a, op, b = match.groups()
    return str(OPERATIONS[op](int(a), int(b)))


class Calculator:
    """One episode's environment (made fresh for each). Its tool's definition is not shown in
    the prompt unless ``show_tools`` (environment.kwargs): the tiny example model reads 128
    tokens, the definition alone takes 100; it learnt the call from its SFT data."""

    def __init__(self, show_tools: bool = False) -> None:
        self.tools = TOOLS if show_tools else None
        self.question = ""
        self.answer = 0
        self.result: str | None = None

    def reset(self, row: dict[str, Any]) -> str:
        self.question, self.answer = str(row["prompt"]), int(row["answer"])
        return self.question

    def step(self, action: Action) -> Step:
        if action.tool_calls:
            call = action.tool_calls[0]
            args = call["arguments"] if isinstance(call["arguments"], dict) else {}
            expression = args.get("expression", self.question)
            if call["name"] != "calculator":
                result = f"error: no tool named {call['name']}"
            elif not isinstance(expression, str):
                result = "error: the expression must be a string"
            else:
                result = self.result = calculate(expression)
            return Step({"role": "tool", "content": result}, 0.0, False)
        numbers = NUMBER.findall(action.text) or ([self.result] if self.result else [])
        right = bool(numbers) and numbers[-1] == str(self.answer)
        return Step(None, 1.0 if right else 0.0, True)
