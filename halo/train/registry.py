"""Training methods by name. Names may nest (`preference/dpo`); each maps to a module.

A method module exposes ``build(cfg, tokenizer) -> halo.train.loop.Method``; its view module
``describe(cfg, tokenizer) -> list[str]``, the loss mask of each source's first example that
`halo launch --dry-run` prints, importable without torch (a login node has only the tokenizer
libraries). Modules are imported only when used, so listing methods needs no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from halo.errors import HaloError

NAME = re.compile(r"[a-z0-9][a-z0-9-]*(/[a-z0-9][a-z0-9-]*)*")


@dataclass(frozen=True)
class MethodSpec:
    name: str
    module: str
    summary: str
    # A launcher the method needs regardless of --nproc (None: chosen by --nproc and config).
    launcher: str | None = None
    # The module with describe(cfg, tok), which imports no torch (None: ``module`` itself).
    view: str | None = None


@dataclass(frozen=True)
class Registry:
    specs: tuple[MethodSpec, ...]

    def __post_init__(self) -> None:
        names = [s.name for s in self.specs]
        for n in names:
            if not NAME.fullmatch(n):
                raise ValueError(f"method name {n!r} is not lower-case words joined by '/'")
        if len(set(names)) != len(names):
            raise ValueError("method names must be unique")

    def get(self, name: str) -> MethodSpec:
        for spec in self.specs:
            if spec.name == name:
                return spec
        hint = ", ".join(s.name for s in self.specs)
        raise HaloError(f"method {name!r}: unknown (known: {hint}; see `halo launch --list`)")

    def names(self, prefix: str = "") -> list[str]:
        """Names, optionally under a family (`preference` lists `preference/...`)."""
        pre = prefix.rstrip("/") + "/" if prefix else ""
        return sorted(s.name for s in self.specs if s.name.startswith(pre))


def default() -> Registry:
    return Registry(
        (
            MethodSpec(
                "sft",
                "halo.train.methods.sft",
                "causal-LM fine-tuning on chat data, loss on assistant tokens",
                view="halo.train.methods.sft_data",
            ),
            MethodSpec(
                "offline-grpo",
                "halo.train.methods.grpo",
                "group-relative advantages over pre-generated, rewarded completions",
                view="halo.train.methods.grpo_data",
            ),
            MethodSpec(
                "online-grpo",
                "halo.train.methods.online_grpo",
                "GRPO on groups sampled live from a rollout server, weights pushed back",
                view="halo.train.methods.online_grpo_data",
            ),
            MethodSpec(
                "preference/dpo",
                "halo.train.methods.dpo",
                "direct preference optimisation on chosen/rejected pairs",
                view="halo.train.methods.dpo_data",
            ),
        )
    )
