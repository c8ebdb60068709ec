"""Hugging Face tokenizers and their Jinja chat templates; the loss mask from assistant spans.

A chat is rendered by the tokenizer's own template (or one named in the config), so what the
trainer trains on is exactly what a server applying the same template will show the model.
Which tokens are trained on comes from the template itself: its ``{% generation %}`` blocks
where it has them (transformers' ``return_assistant_tokens_mask``), otherwise the text each
assistant turn adds, found by rendering the conversation up to and including that turn.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from halo.errors import HaloError
from halo.train.config import Config

Message = dict[str, Any]
# What rendering and tokenizing need (and torch not): the loss-mask view runs where these are.
LIBRARIES = ("transformers", "tokenizers", "jinja2")


@dataclass(frozen=True)
class Rendered:
    """Token ids of a rendered chat and, per token, whether the loss covers it."""

    ids: list[int]
    train: list[bool]


def _has_generation_blocks(template: str) -> bool:
    return "generation %}" in template and "endgeneration" in template


class ChatTokenizer:
    """A transformers tokenizer with a chat template; the trainer's only view of text."""

    def __init__(self, hf: Any, source: str) -> None:
        if not getattr(hf, "chat_template", None):
            raise HaloError(
                f"{source}: the tokenizer has no chat template (set model.chat_template to a "
                ".jinja file)"
            )
        self.hf = hf
        self.source = source
        self._marked = _has_generation_blocks(hf.chat_template)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def eos_id(self) -> int:
        eos = self.hf.eos_token_id
        return int(eos) if eos is not None else 0

    @property
    def pad_id(self) -> int:
        pad = self.hf.pad_token_id
        return int(pad) if pad is not None else self.eos_id

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self.hf.decode(ids, skip_special_tokens=False))

    def text(
        self, messages: list[Message], tools: list[Any] | None = None, gen: bool = False
    ) -> str:
        return str(
            self.hf.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=gen
            )
        )

    def render(
        self, messages: list[Message], tools: list[Any] | None = None, train_from: int = 0
    ) -> Rendered:
        """The chat's tokens; trained on: the assistant turns at index ``train_from`` or later."""
        try:
            if self._marked:
                out = self._render_marked(messages, tools)
            else:
                out = self._render_by_prefix(messages, tools)
        except HaloError:
            raise
        except Exception as exc:  # a template's own error (raise_exception, a missing key)
            raise HaloError(f"chat template: {' '.join(str(exc).split())}") from None
        if train_from:
            # Turns before train_from are context (a DPO or GRPO prompt), never trained on.
            n = len(self._ids(self.text(messages[:train_from], tools)))
            out = Rendered(out.ids, [False] * n + out.train[n:])
        return out

    def _ids(self, text: str) -> list[int]:
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    def _render_marked(self, messages: list[Message], tools: list[Any] | None) -> Rendered:
        enc = self.hf.apply_chat_template(
            messages,
            tools=tools,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        return Rendered(list(enc["input_ids"]), [bool(m) for m in enc["assistant_masks"]])

    def _render_by_prefix(self, messages: list[Message], tools: list[Any] | None) -> Rendered:
        full = self.text(messages, tools)
        spans = []
        for i, msg in enumerate(messages):
            if msg.get("role") != "assistant":
                continue
            start = len(self.text(messages[:i], tools, gen=True)) if i else 0
            upto = self.text(messages[: i + 1], tools)
            if not full.startswith(upto) or start > len(upto):
                raise HaloError(
                    "chat template: rendering is not prefix-stable, so assistant turns cannot be "
                    "located; use a template with {% generation %} blocks (model.chat_template)"
                )
            end = len(upto.rstrip())
            spans.append((start, end))
        enc = self.hf(full, add_special_tokens=False, return_offsets_mapping=True)
        train = [
            any(s <= a and b <= e and b > a for s, e in spans) for a, b in enc["offset_mapping"]
        ]
        return Rendered(list(enc["input_ids"]), train)

    def show_mask(self, r: Rendered) -> str:
        """The rendering with trained-on spans in [[...]]: how a human checks the loss mask."""
        out, span, inside = [], [], False
        for i, t in zip(r.ids, r.train, strict=True):
            if t != inside:
                out.append(self.decode(span) if not inside else f"[[{self.decode(span)}]]")
                span, inside = [], t
            span.append(i)
        out.append(self.decode(span) if not inside else f"[[{self.decode(span)}]]")
        return "".join(out)

    def save(self, folder: Path) -> None:
        self.hf.save_pretrained(str(folder))


def mask_note(what: str, shown: str) -> str:
    """One line for the log and --dry-run: a rendered example with its trained-on spans."""
    return f"{what} example 1 (trained-on text in [[...]]): {shown!r}"


def missing_library() -> str | None:
    """The first of LIBRARIES this Python cannot import, or None."""
    return next((name for name in LIBRARIES if importlib.util.find_spec(name) is None), None)


def for_config(cfg: Config) -> ChatTokenizer:
    """The run's tokenizer: model.tokenizer, else the model's own, with model.chat_template."""
    source = cfg.model.tokenizer or cfg.model.name_or_path
    assert source is not None  # the config requires one of them
    return load(source, cfg.model.chat_template)


def load(source: str, chat_template: Path | None = None) -> ChatTokenizer:
    """A tokenizer from a folder or a cached Hub id; ``chat_template`` replaces its template."""
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(source, local_files_only=True)
    except Exception as exc:  # tokenizers raises bare Exceptions for a malformed tokenizer.json
        if isinstance(exc, HaloError):
            raise
        raise HaloError(
            f"tokenizer {source}: cannot load its tokenizer.json / tokenizer_config.json "
            f"({' '.join(str(exc).split())[:300]}); a Hub id "
            "must be in the Hugging Face cache (halo hf-cache seed)"
        ) from None
    if chat_template is not None:
        from halo.schema import read_text

        hf.chat_template = read_text(chat_template)
    return ChatTokenizer(hf, source)
