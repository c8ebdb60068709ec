"""The losses equal the published formulas, computed here independently of the trainer.

Each test renders real examples through the shipped tokenizer, feeds them to the method's own
collate/prepare/loss through a model whose logits are a fixed function of the input (so the
expected values can be computed on the unpadded text), and compares with the formula written
out from the paper. Swapping DPO's chosen and rejected, negating GRPO's advantages, reversing
its KL or shifting the SFT mask by one token each makes one of these fail.
"""

from __future__ import annotations

import math
import statistics
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from halo.train.config import Config, Dpo, Grpo
from halo.train.data import formats
from halo.train.methods import dpo, dpo_data, grpo, grpo_data, sft, sft_data

pytestmark = pytest.mark.cpu


class BigramModel(torch.nn.Module):
    """Logits at position t are table[token_t] + pos[t]: known without the trainer."""

    def __init__(self, vocab: int, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=g))
        self.pos = torch.nn.Parameter(torch.randn(512, vocab, generator=g) * 0.3)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, **kw: Any
    ) -> SimpleNamespace:
        # Packed rows restart their positions per example, as a real model reads them.
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1])[None]
        return SimpleNamespace(logits=self.table[input_ids] + self.pos[position_ids])

    def logprob_of(self, ids: list[int], j: int) -> float:
        """log p(ids[j] | ids[:j]) for an unpadded sequence."""
        row = self.table[ids[j - 1]] + self.pos[j - 1]
        return float(torch.log_softmax(row.detach().double(), -1)[ids[j]])


def find(ids: list[int], part: list[int]) -> int:
    """Start of the last occurrence of ``part`` in ``ids``."""
    for s in range(len(ids) - len(part), -1, -1):
        if ids[s : s + len(part)] == part:
            return s
    raise AssertionError(f"{part} not in {ids}")


def answer_positions(tok: Any, ids: list[int], answer: str) -> list[int]:
    """Token positions of the assistant's answer and the end-of-turn token after it."""
    part = [*tok.encode(answer), tok.hf.convert_tokens_to_ids("<|im_end|>")]
    start = find(ids, part)
    return list(range(start, start + len(part)))


def chat_ids(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    """The template's text, tokenized: no mask, no trainer code involved."""
    text = tok.hf.apply_chat_template(messages, tokenize=False)
    return list(tok.hf(text, add_special_tokens=False)["input_ids"])


def chat(user: str, answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


def test_sft_loss_is_the_mean_nll_of_the_assistant_tokens(tokenizer: Any) -> None:
    examples = [("What is 2 + 3?", "2 + 3 = 5."), ("What is 7 + 1?", "7 + 1 = 8.")]
    chats = [formats.Chat(chat(u, a)) for u, a in examples]
    seqs, dropped = sft_data.encode(chats, tokenizer, max_len=128)
    assert dropped == 0
    model = BigramModel(tokenizer.vocab_size, seed=1)

    total, count = 0.0, 0
    for user, answer in examples:
        ids = chat_ids(tokenizer, chat(user, answer))
        for j in answer_positions(tokenizer, ids, answer):
            total -= model.logprob_of(ids, j)
            count += 1
    expected = total / count

    for collate in (lambda s: sft_pad(s, tokenizer), sft_pack):
        batch = collate(seqs)
        s, _ = sft.loss(model, batch, None)
        got = float(s.detach()) / float(batch["weights"].sum())
        assert got == pytest.approx(expected, rel=1e-5)
    assert float(sft_pad(seqs, tokenizer)["weights"].sum()) == count


def sft_pad(seqs: list[Any], tok: Any) -> dict[str, torch.Tensor]:
    from halo.train.data.batching import pad

    return pad(seqs, tok.pad_id)


def sft_pack(seqs: list[Any]) -> dict[str, torch.Tensor]:
    from halo.train.data.batching import pack

    return pack(seqs)


PAIRS = [
    ("What is 4 + 4?", "8", "9"),
    ("What is 1 + 5?", "6", "15"),
    ("What is 3 + 3?", "6", "33"),
]


def seq_logprob(model: BigramModel, tok: Any, user: str, answer: str) -> float:
    ids = chat_ids(tok, chat(user, answer))
    return sum(model.logprob_of(ids, j) for j in answer_positions(tok, ids, answer))


def test_dpo_loss_is_the_sigmoid_loss_of_the_paper(tokenizer: Any) -> None:
    beta = 0.7
    rows = [
        (formats.pair({"prompt": p, "chosen": c, "rejected": r}, f"row {i}"), f"row {i}")
        for i, (p, c, r) in enumerate(PAIRS)
    ]
    pairs, dropped = dpo_data.encode(rows, tokenizer, max_len=128)
    assert dropped == 0
    policy, ref = BigramModel(tokenizer.vocab_size, 2), BigramModel(tokenizer.vocab_size, 3)

    losses, wins = [], 0
    for p, c, r in PAIRS:
        pc, pr = seq_logprob(policy, tokenizer, p, c), seq_logprob(policy, tokenizer, p, r)
        rc, rr = seq_logprob(ref, tokenizer, p, c), seq_logprob(ref, tokenizer, p, r)
        z = beta * ((pc - rc) - (pr - rr))
        losses.append(-math.log(1 / (1 + math.exp(-z))))
        wins += z > 0
    expected = sum(losses) / len(losses)

    prepare, loss = dpo.make(Dpo(beta=beta))
    batch = dpo.collate(pairs, tokenizer.pad_id)
    (prepared,) = prepare(policy, ref, [batch])
    s, extra = loss(policy, batch, prepared)
    assert float(s.detach()) / len(PAIRS) == pytest.approx(expected, rel=1e-5)
    assert abs(expected - math.log(2)) > 0.05  # the pairs are far from a tie
    assert float(extra["reward_acc"]) == wins


GROUP = ("What is 2 + 9?", ["11", "8", "111", "2 + 9 = 11."], [1.0, 0.0, 0.0, 0.5])


def grpo_setup(tok: Any, g: Grpo) -> tuple[dict[str, torch.Tensor], Any, Any, Any]:
    row = formats.group(
        {
            "prompt": GROUP[0],
            "completions": [
                {"text": t, "reward": r} for t, r in zip(GROUP[1], GROUP[2], strict=True)
            ],
        },
        "row 1",
    )
    groups, dropped = grpo_data.encode_all([(row, "row 1")], tok, 128)
    assert dropped == 0
    (scored,) = grpo.make_shard(g)(groups, 0, 1)
    return grpo.collate([scored], tok.pad_id), *grpo.make(g)


def trl_advantages(rewards: list[float]) -> list[float]:
    """TRL's group scaling: (r - mean) / (sample std + 1e-4)."""
    mean, std = statistics.mean(rewards), statistics.stdev(rewards)
    return [(r - mean) / (std + 1e-4) for r in rewards]


@pytest.mark.parametrize("loss_type", ["token", "sequence"])
def test_grpo_loss_is_the_clipped_surrogate_plus_k3_kl(tokenizer: Any, loss_type: str) -> None:
    eps, beta = 0.2, 0.5
    g = Grpo(clip_eps=eps, kl_coef=beta, old_policy="reference", loss_type=loss_type)
    batch, prepare, loss, count = grpo_setup(tokenizer, g)
    policy = BigramModel(tokenizer.vocab_size, 4)
    ref = BigramModel(tokenizer.vocab_size, 5)  # also the behaviour (old) policy here

    adv = trl_advantages(GROUP[2])
    per_seq, tokens, clipped, kl_total = [], 0, 0, 0.0
    for text, a in zip(GROUP[1], adv, strict=True):
        ids = chat_ids(tokenizer, chat(GROUP[0], text))
        terms = []
        for j in answer_positions(tokenizer, ids, text):
            lp, lr = policy.logprob_of(ids, j), ref.logprob_of(ids, j)
            ratio = math.exp(lp - lr)
            surrogate = min(ratio * a, min(max(ratio, 1 - eps), 1 + eps) * a)
            clipped += surrogate != ratio * a
            kl = math.exp(lr - lp) - (lr - lp) - 1  # k3 estimate of KL(pi || ref)
            kl_total += kl
            terms.append(-surrogate + beta * kl)
        per_seq.append(terms)
        tokens += len(terms)
    if loss_type == "token":
        expected = sum(sum(t) for t in per_seq) / tokens
    else:
        expected = sum(sum(t) / len(t) for t in per_seq) / len(per_seq)

    (prepared,) = prepare(policy, ref, [batch])
    s, extra = loss(policy, batch, prepared)
    assert float(s.detach()) / count(batch) == pytest.approx(expected, rel=1e-5)
    if loss_type == "token":
        assert float(extra["kl"]) / tokens == pytest.approx(kl_total / tokens, rel=1e-5)
        assert float(extra["clip_frac"]) == clipped
        assert 0 < clipped < tokens  # some tokens clipped, some not: the test can tell


def test_grpo_advantages_scale_like_trl() -> None:
    rewards = [[1.0, 0.0, 0.0, 0.5], [0.0, 0.0, 1.0, 1.0]]
    group = grpo.advantages(rewards, "group", 1e-4)
    for got, r in zip(group, rewards, strict=True):
        assert got == pytest.approx(trl_advantages(r))
    flat = [x for r in rewards for x in r]
    std = statistics.stdev(flat)
    batch = grpo.advantages(rewards, "batch", 1e-4)
    assert batch[1] == pytest.approx([(x - 0.5) / (std + 1e-4) for x in rewards[1]])
    assert grpo.advantages(rewards, "none", 1e-4)[0] == pytest.approx(
        [0.625, -0.375, -0.375, 0.125]
    )
    assert grpo.advantages([[1.0, 1.0]], "group", 1e-4) == [[0.0, 0.0]]


def test_grpo_first_pass_with_the_current_policy_has_ratio_one(tokenizer: Any) -> None:
    g = Grpo(clip_eps=0.2, kl_coef=0.0, old_policy="current")
    batch, prepare, loss, count = grpo_setup(tokenizer, g)
    policy = BigramModel(tokenizer.vocab_size, 6)
    (prepared,) = prepare(policy, None, [batch])
    s, extra = loss(policy, batch, prepared)
    adv = batch["advantages"][:, None]
    # ratio 1 everywhere: the loss is -mean(A) over tokens, nothing is clipped ...
    expected = -float((adv * batch["weights"]).sum() / batch["weights"].sum())
    assert float(s.detach()) / count(batch) == pytest.approx(expected, rel=1e-6)
    assert float(extra["clip_frac"]) == 0
    # ... and the gradient is the policy gradient A * grad log pi.
    s.backward()
    assert policy.table.grad is not None and float(policy.table.grad.abs().sum()) > 0


def test_clip_frac_counts_only_applied_clips() -> None:
    g = Grpo(clip_eps=0.2, old_policy="reference")
    _, loss, _ = grpo.make(g)

    class Fixed(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, **kw: Any) -> SimpleNamespace:
            # Four one-token sequences; the target's new probability is 0.9 (old 0.5): ratio 1.8.
            return SimpleNamespace(logits=torch.log(torch.tensor([[[0.9, 0.1]]] * 4)))

    batch = {
        "input_ids": torch.zeros(4, 1, dtype=torch.long),
        "targets": torch.zeros(4, 1, dtype=torch.long),
        "weights": torch.ones(4, 1),
        "advantages": torch.tensor([1.0, 1.0, -1.0, -1.0]),
    }
    old = torch.log(torch.full((4, 1), 0.5))
    s, extra = loss(Fixed(), batch, {"old": old, "ref": None})
    # Positive advantage: clipped at 1.2 (applied); negative: the unclipped -1.8 is smaller,
    # so that token keeps its gradient and is not counted.
    assert float(s.detach()) == pytest.approx(-1.2 * 2 + 1.8 * 2)
    assert float(extra["clip_frac"]) == 2


def test_grpo_defaults_follow_trl() -> None:
    g = Grpo()
    assert (g.old_policy, g.scale_rewards, g.loss_type, g.adv_eps) == (
        "current",
        "group",
        "token",
        1e-4,
    )
    assert Config.model_fields["grpo"].default is None
