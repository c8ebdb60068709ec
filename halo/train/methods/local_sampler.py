"""Sampling from the policy in the trainer's own process: ``rollout.backend: local``.

The same contract as the rollout server's client (halo.rollout.client.Client.complete): for
each prompt (token ids) ``n`` samples, each the token ids drawn (ending with the end-of-turn
token when the model stopped) with its text and finish reason. It draws from the policy's
current weights, so nothing is pushed; it is meant for small models and for tests, where it
lets environmental-grpo train with the real model writing its turns and no server at all.

Sampling is plain ancestral sampling at ``temperature`` (greedy at 0) with the model's KV
cache, from a generator seeded per prompt as the client seeds its requests, so a batch is
reproducible and leaves the trainer's own random state alone. Under DDP every process holds
the whole model and the main process samples with its unwrapped copy; FSDP shards the
weights, so it has no local sampler.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from halo.errors import HaloError
from halo.rollout.client import Sample, prompt_seed
from halo.train.data.tokenizer import ChatTokenizer


class LocalSampler:
    def __init__(self, model: nn.Module, tok: ChatTokenizer) -> None:
        if hasattr(model, "reshard") or type(model).__name__.startswith("FSDP"):
            raise HaloError("rollout.backend: local cannot sample from an FSDP-sharded model")
        self.model = getattr(model, "module", model)  # DDP's replica: no hooks, no collectives
        self.tok = tok

    @torch.no_grad()
    def one(
        self, prompt: Sequence[int], n: int, max_tokens: int, temperature: float, seed: int
    ) -> list[Sample]:
        device = next(self.model.parameters()).device
        gen = torch.Generator(device=device).manual_seed(seed)
        ids = torch.tensor([list(prompt)] * n, device=device)
        out = self.model(input_ids=ids, use_cache=True)
        drawn: list[list[int]] = [[] for _ in range(n)]
        stopped = [False] * n
        for t in range(max_tokens):
            logits = out.logits[:, -1].float()
            if temperature > 0:
                probs = torch.softmax(logits / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
            else:
                nxt = logits.argmax(-1)
            for i, token in enumerate(nxt.tolist()):
                if not stopped[i]:
                    drawn[i].append(token)
                    stopped[i] = token == self.tok.eos_id
            if all(stopped) or t == max_tokens - 1:
                break
            out = self.model(
                input_ids=nxt[:, None], past_key_values=out.past_key_values, use_cache=True
            )
        return [
            Sample(tuple(d), self.tok.decode(d[:-1] if s else d), "stop" if s else "length")
            for d, s in zip(drawn, stopped, strict=True)
        ]

    def complete(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        max_tokens: int | Sequence[int],
        temperature: float,
        seed: int,
    ) -> list[list[Sample]]:
        budgets = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
        was = self.model.training
        self.model.eval()
        try:
            return [
                self.one(p, n, b, temperature, prompt_seed(seed, i))
                for i, (p, b) in enumerate(zip(prompts, budgets, strict=True))
            ]
        finally:
            self.model.train(was)
