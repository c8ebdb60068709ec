"""Dataset rows in the common formats -> chats, preference pairs and rewarded groups.

- OpenAI messages: ``{"messages": [...], "tools": [...]}``; content is a string or a list of
  ``{"type": "text", "text": ...}`` parts; ``tool`` turns; assistant ``tool_calls``.
- ShareGPT: ``{"conversations": [{"from": "human", "value": ...}, ...]}``, with columns and
  tags renamed as in LLaMA-Factory's dataset_info (``function_call`` / ``observation`` turns
  become tool calls and tool turns).
- prompt/completion: strings or message lists.
- preference: ``prompt`` plus ``chosen`` / ``rejected`` (strings or message lists), or full
  chosen/rejected conversations whose shared beginning is the prompt.
- grpo: ``prompt`` plus ``completions: [{"text": ..., "reward": ...}, ...]``.

Each problem is one HaloError naming the row (``file:line``) and the key.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from halo.errors import HaloError

Message = dict[str, Any]
ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Chat:
    messages: list[Message]
    tools: list[Any] | None = None
    # Assistant turns before this index are context, not trained on.
    train_from: int = 0
    where: str = ""


@dataclass(frozen=True)
class PairRow:
    prompt: list[Message]
    chosen: list[Message]
    rejected: list[Message]
    tools: list[Any] | None = None


@dataclass(frozen=True)
class GroupRow:
    prompt: list[Message]
    completions: list[str]
    rewards: list[float]
    tools: list[Any] | None = None


SHAREGPT_COLUMNS = {"messages": "conversations", "system": "system", "tools": "tools"}
SHAREGPT_TAGS = {
    "role_tag": "from",
    "content_tag": "value",
    "user_tag": "human",
    "assistant_tag": "gpt",
    "observation_tag": "observation",
    "function_tag": "function_call",
    "system_tag": "system",
}


def detect(row: dict[str, Any], columns: dict[str, str]) -> str:
    if "messages" in row:
        return "messages"
    if columns.get("messages", "conversations") in row:
        return "sharegpt"
    if "completions" in row:
        return "grpo"
    if "chosen" in row and "rejected" in row:
        return "preference"
    if "prompt" in row and "completion" in row:
        return "prompt_completion"
    raise HaloError(
        "cannot tell the format from the keys "
        f"{sorted(row)[:6]}: expected messages, conversations, prompt/completion, "
        "chosen/rejected or completions (or set format on the source)"
    )


def _content(value: Any, where: str, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in value
    ):
        return value
    raise HaloError(
        f"{where}: expected a string or a list of {{'type': 'text', 'text': ...}} parts"
    )


def _tool_calls(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise HaloError(f"{where}: expected a list of tool calls")
    out = []
    for k, call in enumerate(value):
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)):
            raise HaloError(
                f"{where}[{k}]: expected {{'function': {{'name': ..., 'arguments': ...}}}}"
            )
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                raise HaloError(f"{where}[{k}].function.arguments: not valid JSON") from None
        out.append({"type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def messages(value: Any, where: str) -> list[Message]:
    """A validated copy of an OpenAI-style message list."""
    if not isinstance(value, list) or not value:
        raise HaloError(f"{where}: expected a non-empty list of messages")
    out = []
    for n, msg in enumerate(value):
        at = f"{where}[{n}]"
        if not isinstance(msg, dict) or msg.get("role") not in ROLES:
            raise HaloError(f"{at}.role: expected one of {', '.join(ROLES)}")
        clean: Message = {"role": msg["role"]}
        calls = msg.get("tool_calls")
        if calls is not None:
            if msg["role"] != "assistant":
                raise HaloError(f"{at}.tool_calls: only assistant messages call tools")
            clean["tool_calls"] = _tool_calls(calls, f"{at}.tool_calls")
        clean["content"] = _content(msg.get("content"), f"{at}.content", allow_none=bool(calls))
        for key in ("name", "tool_call_id"):
            if isinstance(msg.get(key), str):
                clean[key] = msg[key]
        out.append(clean)
    return out


def _tools(value: Any, where: str) -> list[Any] | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise HaloError(f"{where}: not valid JSON") from None
    if not isinstance(value, list):
        raise HaloError(f"{where}: expected a list of tool definitions")
    return value


def prompt_messages(value: Any, where: str) -> list[Message]:
    """A prompt as messages: a string is one user turn; a list is validated messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return messages(value, where)


def _answer(value: Any, where: str) -> list[Message]:
    if isinstance(value, str):
        return [{"role": "assistant", "content": value}]
    msgs = messages(value, where)
    if msgs[-1]["role"] != "assistant":
        raise HaloError(f"{where}: expected the last message to be the assistant's")
    return msgs


def sharegpt(
    row: dict[str, Any], where: str, columns: dict[str, str], tags: dict[str, str]
) -> Chat:
    cols = {**SHAREGPT_COLUMNS, **columns}
    tg = {**SHAREGPT_TAGS, **tags}
    roles = {
        tg["user_tag"]: "user",
        tg["assistant_tag"]: "assistant",
        tg["observation_tag"]: "tool",
        tg["function_tag"]: "function",
        tg["system_tag"]: "system",
    }
    turns = row.get(cols["messages"])
    if not isinstance(turns, list) or not turns:
        raise HaloError(f"{where}: {cols['messages']}: expected a non-empty list of turns")
    out: list[Message] = []
    if isinstance(row.get(cols["system"]), str) and row[cols["system"]]:
        out.append({"role": "system", "content": row[cols["system"]]})
    for n, turn in enumerate(turns):
        at = f"{where}: {cols['messages']}[{n}]"
        tag = turn.get(tg["role_tag"]) if isinstance(turn, dict) else None
        if tag not in roles:
            raise HaloError(f"{at}.{tg['role_tag']}: expected one of {', '.join(map(str, roles))}")
        value = turn.get(tg["content_tag"])
        if not isinstance(value, str):
            raise HaloError(f"{at}.{tg['content_tag']}: expected a string")
        role = roles[tag]
        if role == "function":
            try:
                call = json.loads(value)
            except ValueError:
                raise HaloError(f"{at}: a {tag} turn must hold a JSON tool call") from None
            calls = _tool_calls(call if isinstance(call, list) else [call], at)
            out.append({"role": "assistant", "content": "", "tool_calls": calls})
        else:
            out.append({"role": role, "content": value})
    msgs = messages(out, f"{where}: {cols['messages']}")
    return Chat(msgs, _tools(row.get(cols["tools"]), f"{where}: {cols['tools']}"), 0, where)


def chat(
    row: dict[str, Any], fmt: str, where: str, columns: dict[str, str], tags: dict[str, str]
) -> Chat:
    """An SFT example from a messages, ShareGPT or prompt/completion row."""
    tools = _tools(row.get("tools"), f"{where}: tools")
    if fmt == "messages":
        return Chat(messages(row.get("messages"), f"{where}: messages"), tools, 0, where)
    if fmt == "sharegpt":
        return sharegpt(row, where, columns, tags)
    if fmt == "prompt_completion":
        prompt = prompt_messages(row.get("prompt"), f"{where}: prompt")
        answer = _answer(row.get("completion"), f"{where}: completion")
        return Chat(prompt + answer, tools, len(prompt), where)
    raise HaloError(
        f"{where}: format {fmt} is not SFT data (messages, sharegpt, prompt_completion)"
    )


def pair(row: dict[str, Any], where: str) -> PairRow:
    tools = _tools(row.get("tools"), f"{where}: tools")
    if row.get("prompt") is not None:
        prompt = prompt_messages(row["prompt"], f"{where}: prompt")
        chosen = _answer(row.get("chosen"), f"{where}: chosen")
        rejected = _answer(row.get("rejected"), f"{where}: rejected")
        return PairRow(prompt, chosen, rejected, tools)
    # Implicit prompt: full conversations that share their beginning.
    chosen = _answer(row.get("chosen"), f"{where}: chosen")
    rejected = _answer(row.get("rejected"), f"{where}: rejected")
    n = 0
    while n < min(len(chosen), len(rejected)) - 1 and chosen[n] == rejected[n]:
        n += 1
    if n == 0:
        raise HaloError(f"{where}: chosen and rejected share no prompt (set 'prompt')")
    return PairRow(chosen[:n], chosen[n:], rejected[n:], tools)


def group(row: dict[str, Any], where: str) -> GroupRow:
    prompt = prompt_messages(row.get("prompt"), f"{where}: prompt")
    comps = row.get("completions")
    if not isinstance(comps, list) or len(comps) < 2:
        raise HaloError(f"{where}: completions: expected a list of at least 2")
    texts, rewards = [], []
    for k, c in enumerate(comps):
        text = c.get("text", c.get("content")) if isinstance(c, dict) else None
        reward = c.get("reward") if isinstance(c, dict) else None
        if not (
            isinstance(text, str)
            and isinstance(reward, int | float)
            and not isinstance(reward, bool)
            and math.isfinite(reward)
        ):
            raise HaloError(
                f"{where}: completions[{k}]: expected {{'text': str, 'reward': finite number}}"
            )
        texts.append(text)
        rewards.append(float(reward))
    return GroupRow(prompt, texts, rewards, _tools(row.get("tools"), f"{where}: tools"))
