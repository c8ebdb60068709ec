"""Training methods by name. Names may nest (`preference/dpo`); each maps to a module.

A method module exposes ``build(cfg, tokenizer) -> halo.train.state.Method``; its view module
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
    # What `halo launch --list` says of it: the rows it reads, whether it loads a frozen
    # reference model and whether it needs a rollout server.
    data: str = ""
    reference: str = "no"
    server: str = "no"


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


PREFERENCE_DATA = "prompt + chosen + rejected"


def default() -> Registry:
    return Registry(
        (
            MethodSpec(
                "sft",
                "halo.train.methods.sft",
                "causal-LM fine-tuning on chat data, loss on assistant tokens",
                view="halo.train.methods.sft_data",
                data="messages | sharegpt | prompt+completion",
            ),
            MethodSpec(
                "offline-grpo",
                "halo.train.methods.grpo",
                "GRPO on pre-generated, rewarded completions",
                view="halo.train.methods.grpo_data",
                data="prompt + completions [{text, reward}]",
                reference="if grpo.kl_coef > 0",
            ),
            MethodSpec(
                "online-grpo",
                "halo.train.methods.online_grpo",
                "GRPO on groups sampled live, weights pushed to the server",
                view="halo.train.methods.online_grpo_data",
                data="prompt (+ what the reward reads)",
                reference="if grpo.kl_coef > 0",
                server="yes",
            ),
            MethodSpec(
                "environmental-grpo",
                "halo.train.methods.environmental_grpo",
                "GRPO on multi-turn episodes with an environment",
                view="halo.train.methods.environmental_grpo_data",
                data="rows for the environment's reset(row)",
                reference="if grpo.kl_coef > 0",
                server="yes, or rollout.backend: local",
            ),
            MethodSpec(
                "classification",
                "halo.train.methods.classification",
                "a classification head, pooled at the last non-pad token",
                view="halo.train.methods.classification_data",
                data="text + label",
            ),
            MethodSpec(
                "embedding",
                "halo.train.methods.embedding",
                "text embeddings, InfoNCE over in-batch negatives",
                view="halo.train.methods.embedding_data",
                data="query + positive [+ negatives]",
            ),
            MethodSpec(
                "preference/dpo",
                "halo.train.methods.dpo",
                "DPO on chosen/rejected pairs, against a reference",
                view="halo.train.methods.dpo_data",
                data=PREFERENCE_DATA,
                reference="yes",
            ),
            MethodSpec(
                "preference/simpo",
                "halo.train.methods.simpo",
                "SimPO: a length-normalised margin, reference-free",
                view="halo.train.methods.dpo_data",
                data=PREFERENCE_DATA,
            ),
            MethodSpec(
                "preference/smpo",
                "halo.train.methods.smpo",
                "SMPO: a margin on mean log-probs + SFT, reference-free",
                view="halo.train.methods.dpo_data",
                data=PREFERENCE_DATA,
            ),
        )
    )
