"""Multi-turn environments and the episodes the policy plays in them (no torch here).

An environment is any object with two methods, made fresh for each episode by the factory
that ``environment.path`` names (``package.module:Factory`` or ``file.py:Factory``, called with
``environment.kwargs``), as in the verifiers library and SkyRL-Gym:

- ``reset(row)`` -> the prompt: a string (one user turn) or a list of chat messages. ``row`` is
  the dataset row the episode plays.
- ``step(action)`` -> ``Step(observation, reward, done)`` (or that triple as a tuple).
  ``action`` is an ``Action``: the text the model wrote this turn and the tool calls in it.
  The observation is what the environment says next: a string (a user turn), a message or a
  list of messages (``{"role": "tool", "content": ...}`` answers a tool call), or None.
- an optional ``tools`` attribute: OpenAI tool definitions, which the chat template shows the
  model (and the model calls as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``).

An episode is one token sequence: the rendered prompt, then per turn the tokens the model
sampled (exactly those, ending with its end-of-turn token) and the environment's reply as the
chat template renders it, up to the next generation prompt. Only the model's tokens are
trained on. Its reward is the sum of the step rewards.

An episode ends when the environment says done, at ``environment.max_turns`` model turns, when
its tokens reach ``environment.max_tokens`` (a turn is cut there), or when a turn stops at
``rollout.max_tokens`` before its end-of-turn token. An environment that raises, or answers
``reset`` or ``step`` with something malformed, ends its episode with the error recorded and a
reward of 0; the other episodes and training go on.

Turns are sampled through a ``Sampler``: the rollout server's client (halo.rollout.client), or
the policy itself in the trainer's process (halo.train.methods.local_sampler). Episodes whose
contexts are the same (the n episodes of a group at their first turn) are one request for n
samples; the others one each.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from halo.errors import HaloError
from halo.rollout.client import Sample
from halo.train.data import formats
from halo.train.data.tokenizer import ChatTokenizer, Message

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class Action:
    """One model turn: its text (without the end-of-turn token) and the tool calls in it, each
    ``{"name": ..., "arguments": {...}}`` (calls that are not valid JSON are left out; the text
    still has them)."""

    text: str
    tool_calls: list[dict[str, Any]]
    turn: int  # 1 for the model's first turn


@dataclass(frozen=True)
class Step:
    observation: str | Message | list[Message] | None
    reward: float
    done: bool


class Sampler(Protocol):
    def complete(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        max_tokens: int | Sequence[int],
        temperature: float,
        seed: int,
    ) -> list[list[Sample]]: ...


@dataclass(frozen=True)
class Limits:
    max_turns: int
    max_tokens: int  # per episode, prompt included
    turn_tokens: int  # per model turn


@dataclass
class Episode:
    ids: list[int]
    train: list[bool]  # per token: written by the model
    reward: float = 0.0
    turns: int = 0
    # done, turn_limit, token_limit, cut (a turn hit rollout.max_tokens), error
    status: str = ""
    error: str | None = None


@dataclass
class _Live:
    episode: Episode
    env: Any
    messages: list[Message]
    tools: list[Any] | None
    where: str

    @property
    def done(self) -> bool:
        return bool(self.episode.status)


def load(path: str, key: str = "environment.path") -> Callable[..., Any]:
    """The factory ``path`` names: 'package.module:Name', or 'file.py:Name' (an absolute path
    after the config resolved it)."""
    module_name, _, name = path.rpartition(":")
    try:
        if module_name.endswith(".py"):
            file = Path(module_name)
            if not file.is_file():
                raise HaloError(f"{key}: {file}: no such file")
            spec = importlib.util.spec_from_file_location(f"halo_env_{file.stem}", file)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # dataclasses and pickling look modules up here
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
        factory = getattr(module, name)
    except HaloError:
        raise
    except Exception as exc:  # the user's module: whatever importing it raises is one line
        raise HaloError(f"{key}: cannot load {path} ({type(exc).__name__}: {exc})") from None
    if not callable(factory):
        raise HaloError(f"{key}: {path} is not callable")
    return factory


def tool_calls(text: str) -> list[dict[str, Any]]:
    """The ``<tool_call>{json}</tool_call>`` calls of a turn (Hermes/Qwen style, the format
    the examples' chat template renders)."""
    calls = []
    for body in TOOL_CALL.findall(text):
        try:
            call = json.loads(body)
        except ValueError:
            continue
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            args = call.get("arguments", {})
            calls.append({"name": call["name"], "arguments": args if args is not None else {}})
    return calls


def observation_messages(obs: Any) -> list[Message]:
    if obs is None:
        return []
    if isinstance(obs, str):
        return [{"role": "user", "content": obs}]
    if isinstance(obs, dict):
        obs = [obs]
    return formats.messages(obs, "observation")


def as_step(result: Any) -> Step:
    """A step's answer as a Step; anything else is a malformed step (ValueError)."""
    if isinstance(result, Step):
        obs, reward, done = result.observation, result.reward, result.done
    elif isinstance(result, tuple | list) and len(result) in (3, 4):  # gym-style, info ignored
        obs, reward, done = result[0], result[1], result[2]
    else:
        raise ValueError(f"expected Step(observation, reward, done), got {type(result).__name__}")
    if not isinstance(reward, int | float) or isinstance(reward, bool) or not math.isfinite(reward):
        raise ValueError(f"reward: expected a finite number, got {reward!r}")
    if not isinstance(done, bool):
        raise ValueError(f"done: expected true or false, got {done!r}")
    return Step(obs, float(reward), done)


def _fail(live: _Live, what: str, exc: BaseException) -> None:
    message = exc.message if isinstance(exc, HaloError) else f"{type(exc).__name__}: {exc}"
    ep = live.episode
    ep.status, ep.reward = "error", 0.0
    ep.error = " ".join(f"{live.where}: {what}: {message}".split())[:500]


def start(
    factory: Callable[..., Any], kwargs: dict[str, Any], row: dict[str, Any], where: str,
    tok: ChatTokenizer, limits: Limits,
) -> _Live:  # fmt: skip
    live = _Live(Episode([], []), None, [], None, where)
    try:
        live.env = factory(**kwargs)
        live.tools = getattr(live.env, "tools", None)
        prompt = live.env.reset(row)
        if isinstance(prompt, str):
            live.messages = [{"role": "user", "content": prompt}]
        else:
            live.messages = formats.messages(prompt, "reset()")
    except Exception as exc:  # the user's environment: whatever it raises ends the episode
        _fail(live, "reset", exc)
        return live
    try:
        ids = tok.encode(tok.text(live.messages, live.tools, gen=True))
    except HaloError as exc:  # the template refuses the prompt: the environment's fault
        _fail(live, "reset", exc)
        return live
    if len(ids) >= limits.max_tokens:
        _fail(live, "reset", ValueError(f"a prompt of {len(ids)} tokens fills the episode"))
        return live
    live.episode.ids, live.episode.train = ids, [False] * len(ids)
    return live


def _glue(tok: ChatTokenizer, before: list[Message], turn: Message, obs: list[Message],
          tools: list[Any] | None) -> list[int]:  # fmt: skip
    """The tokens between the model's end-of-turn token and its next turn, as the template
    renders the environment's reply (the model's own tokens are kept, never re-rendered)."""
    upto = tok.text([*before, turn], tools)
    full = tok.text([*before, turn, *obs], tools, gen=True)
    eos = str(tok.hf.eos_token)
    end = upto.rfind(eos)
    if not full.startswith(upto) or end < 0:
        raise HaloError(
            "chat template: an environment turn does not extend the rendered conversation "
            "(the template must be prefix-stable and end assistant turns with the eos token)"
        )
    return tok.encode(upto[end + len(eos) :] + full[len(upto) :])


def _turn(live: _Live, sample: Sample, tok: ChatTokenizer, limits: Limits) -> None:
    """The model's sampled turn into the episode, the environment's answer, and what follows."""
    ep = live.episode
    ids = list(sample.token_ids)
    if sample.finish_reason == "stop" and (not ids or ids[-1] != tok.eos_id):
        ids.append(tok.eos_id)  # a server may leave out the stop token it sampled: the model's
    whole = len(ids)
    ids = ids[: limits.max_tokens - len(ep.ids)]
    ep.ids += ids
    ep.train += [True] * len(ids)
    ep.turns += 1
    if len(ids) < whole or len(ep.ids) >= limits.max_tokens:
        ep.status = "token_limit"
        return
    if not ids or ids[-1] != tok.eos_id:
        ep.status = "cut"
        return
    text = tok.decode(ids[:-1])
    action = Action(text, tool_calls(text), ep.turns)
    try:
        step = as_step(live.env.step(action))
        obs = observation_messages(step.observation)
    except Exception as exc:  # the user's environment: whatever it raises ends the episode
        _fail(live, f"step {ep.turns}", exc)
        return
    ep.reward += step.reward
    if step.done:
        ep.status = "done"
        return
    if ep.turns >= limits.max_turns:
        ep.status = "turn_limit"
        return
    turn = {"role": "assistant", "content": text}
    try:
        glue = _glue(tok, live.messages, turn, obs, live.tools)
    except HaloError as exc:  # a message the template refuses: the environment's answer
        if exc.message.startswith("chat template: an environment turn"):
            raise
        _fail(live, f"step {ep.turns}", exc)
        return
    live.messages = [*live.messages, turn, *obs]
    if len(ep.ids) + len(glue) >= limits.max_tokens:
        ep.status = "token_limit"
        return
    ep.ids += glue
    ep.train += [False] * len(glue)


def play(
    factory: Callable[..., Any],
    kwargs: dict[str, Any],
    rows: Sequence[tuple[dict[str, Any], str]],
    n: int,
    tok: ChatTokenizer,
    sampler: Sampler,
    limits: Limits,
    temperature: float,
    seed: int,
) -> list[list[Episode]]:
    """``n`` episodes of each (row, where), turn by turn, grouped per row in order."""
    groups = [
        [start(factory, kwargs, row, where, tok, limits) for _ in range(n)] for row, where in rows
    ]
    live = [x for g in groups for x in g]
    turn = 0
    while any(not x.done for x in live):
        active = [x for x in live if not x.done]
        # One request per distinct context: a group's episodes share their first one.
        contexts: dict[tuple[int, ...], list[_Live]] = {}
        for x in active:
            contexts.setdefault(tuple(x.episode.ids), []).append(x)
        keys = list(contexts)
        budgets = [min(limits.turn_tokens, limits.max_tokens - len(k)) for k in keys]
        counts = {len(v) for v in contexts.values()}
        if len(counts) == 1:
            samples = sampler.complete(keys, counts.pop(), budgets, temperature, seed * 1009 + turn)
        else:  # groups of different sizes: one request each
            samples = [
                sampler.complete(
                    [k], len(contexts[k]), [b], temperature, seed * 1009 + turn * 31 + i
                )[0]
                for i, (k, b) in enumerate(zip(keys, budgets, strict=True))
            ]
        for k, got in zip(keys, samples, strict=True):
            for x, sample in zip(contexts[k], got, strict=True):
                _turn(x, sample, tok, limits)
        turn += 1
    return [[x.episode for x in g] for g in groups]


@dataclass
class Tally:
    """What a batch of episodes did, for the step's metrics row and its log line."""

    episodes: int = 0
    reward: float = 0.0
    turns: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    first_error: str | None = None

    def add(self, groups: list[list[Episode]]) -> Tally:
        for g in groups:
            for ep in g:
                self.episodes += 1
                self.reward += ep.reward
                self.turns += ep.turns
                self.by_status[ep.status] = self.by_status.get(ep.status, 0) + 1
                if ep.error and self.first_error is None:
                    self.first_error = ep.error
        return self

    def metrics(self) -> dict[str, float]:
        n = max(self.episodes, 1)
        return {
            "reward": self.reward / n,
            "turns": self.turns / n,
            "env_errors": float(self.by_status.get("error", 0)),
            "truncated": float(sum(self.by_status.get(s, 0) for s in ("token_limit", "cut"))),
            "turn_limit": float(self.by_status.get("turn_limit", 0)),
        }
