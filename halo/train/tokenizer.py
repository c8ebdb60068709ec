"""A byte-level tokenizer with special tokens and a ChatML chat template.

Bytes are ids 0..255, specials follow. It is built deterministically (nothing to download)
and saved next to each checkpoint as tokenizer.json so a model dir is self-contained.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from halo.errors import HaloError

SPECIALS = ("<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>")
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Tokenizer:
    specials: tuple[str, ...] = SPECIALS
    _ids: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_ids", {s: 256 + i for i, s in enumerate(self.specials)})

    @property
    def vocab_size(self) -> int:
        return 256 + len(self.specials)

    def special(self, name: str) -> int:
        return self._ids[name]

    @property
    def pad_id(self) -> int:
        return self._ids["<|pad|>"]

    @property
    def eos_id(self) -> int:
        return self._ids["<|eos|>"]

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        out = bytearray()
        names = {v: k for k, v in self._ids.items()}
        for i in ids:
            if i < 256:
                out.append(i)
            else:
                out += names[i].encode()
        return out.decode("utf-8", errors="replace")

    def to_json(self) -> str:
        return json.dumps({"type": "byte-level", "specials": list(self.specials)}, indent=2) + "\n"

    @classmethod
    def load(cls, path: Path) -> Tokenizer:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise HaloError(f"{path}: not a readable tokenizer.json ({exc})") from exc
        if data.get("type") != "byte-level" or not isinstance(data.get("specials"), list):
            raise HaloError(f"{path}: expected a byte-level tokenizer with a 'specials' list")
        return cls(tuple(data["specials"]))


def render_chat(
    tok: Tokenizer, messages: list[dict[str, str]], where: str = "messages"
) -> tuple[list[int], list[bool]]:
    """Token ids of the ChatML rendering and, per token, whether it is trained on.

    Only assistant content and the ``<|im_end|>`` that closes it are trained on: the model
    must learn to answer and to stop, never to predict the user's or system's turns.
    """
    ids: list[int] = [tok.special("<|bos|>")]
    train: list[bool] = [False]
    start, end = tok.special("<|im_start|>"), tok.special("<|im_end|>")
    for n, msg in enumerate(messages):
        role, content = msg.get("role"), msg.get("content")
        if role not in ROLES or not isinstance(content, str):
            raise HaloError(
                f"{where}[{n}]: expected role in {list(ROLES)} and string content, got {msg!r}"
            )
        header = [start, *tok.encode(f"{role}\n")]
        body = [*tok.encode(content), end]
        newline = tok.encode("\n")
        ids += header + body + newline
        is_asst = role == "assistant"
        train += [False] * len(header) + [is_asst] * len(body) + [False] * len(newline)
    return ids, train


def show_mask(tok: Tokenizer, ids: list[int], train: list[bool]) -> str:
    """The rendering with trained-on spans in [[...]]: how a human checks the loss mask."""
    out, span, inside = [], [], False
    for i, t in zip(ids, train, strict=True):
        if t != inside:
            out.append(tok.decode(span) if not inside else f"[[{tok.decode(span)}]]")
            span, inside = [], t
        span.append(i)
    out.append(tok.decode(span) if not inside else f"[[{tok.decode(span)}]]")
    return "".join(out)
