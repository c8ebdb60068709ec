"""The preference family: SimPO and SMPO beside DPO.

Losses are checked twice: on fixed mean log-probabilities against the formulas written out by
hand, and end to end through each method's own collate/loss on a model whose log-probabilities
are known without the trainer (test_math's BigramModel), where the responses of a pair differ
in length, so dropping SimPO's length normalisation changes the value. The three methods share
one data path and one forward over chosen and rejected (counted), sum in fp32, and only DPO
loads a reference model. The examples train with a falling loss.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from halo.train import config
from halo.train.config import Simpo, Smpo
from halo.train.data import formats
from halo.train.methods import dpo, dpo_data, preference, simpo, smpo

from .conftest import EXAMPLES, metrics, train_here
from .test_math import BigramModel, answer_positions, chat, chat_ids

pytestmark = pytest.mark.cpu

# (prompt, chosen, rejected): the responses differ in length, so sums and means disagree.
PAIRS = [
    ("What is 4 + 4?", "8", "4 + 4 = 9."),
    ("What is 1 + 5?", "1 + 5 = 6.", "15"),
    ("What is 3 + 3?", "6", "The sum is 33."),
]


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def relu(x: float) -> float:
    return max(x, 0.0)


# Mean log-probabilities (chosen, rejected), around the margin from all sides: far below it,
# inside SMPO's band [margin_min, margin_min + margin_delta], above it.
MEANS = [(-1.2, -2.0), (-2.0, -1.8), (-1.0, -1.4), (-0.5, -3.0)]


def simpo_by_hand(c: float, r: float, beta: float, gamma: float) -> float:
    return -math.log(sigmoid(beta * (c - r) - gamma))


def smpo_by_hand(c: float, r: float, s: Smpo) -> float:
    lower = c - r - s.margin_min
    upper = lower - s.margin_delta
    pref = {
        "sigmoid": -math.log(sigmoid(s.beta * lower)),
        "hinge": relu(-s.beta * lower),
        "ipo": (s.beta * lower) ** 2,
        "smooth_lower_bound": relu(-s.beta * lower) ** 2,
        "smooth_double_bound": relu(-s.beta * lower) ** 2 + relu(s.beta * upper) ** 2,
    }[s.loss_type]
    return pref - (s.chosen_sft_ratio * c + (1 - s.chosen_sft_ratio) * r)


def test_simpo_loss_on_fixed_logprobs_is_the_papers() -> None:
    s = Simpo(beta=2.5, gamma=1.4)
    c = torch.tensor([m[0] for m in MEANS], dtype=torch.float64)
    r = torch.tensor([m[1] for m in MEANS], dtype=torch.float64)
    got = simpo.losses(c, r, s).tolist()
    assert got == pytest.approx([simpo_by_hand(a, b, 2.5, 1.4) for a, b in MEANS], rel=1e-12)
    # By hand, the first: -log sigmoid(2.5 * 0.8 - 1.4) = -log sigmoid(0.6).
    assert got[0] == pytest.approx(0.4374879504858857, rel=1e-12)


LOSS_TYPES = ["sigmoid", "hinge", "ipo", "smooth_lower_bound", "smooth_double_bound"]


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_smpo_loss_on_fixed_logprobs_is_the_toolkits(loss_type: str) -> None:
    s = Smpo(loss_type=loss_type, beta=1.3, margin_min=0.35, margin_delta=0.2, chosen_sft_ratio=0.7)
    c = torch.tensor([m[0] for m in MEANS], dtype=torch.float64)
    r = torch.tensor([m[1] for m in MEANS], dtype=torch.float64)
    got = (smpo.preference_losses(c, r, s) + smpo.sft_losses(c, r, s)).tolist()
    assert got == pytest.approx([smpo_by_hand(a, b, s) for a, b in MEANS], rel=1e-12)


def test_smpo_losses_by_hand_at_one_point() -> None:
    # c - r = 0.8 above margin_min 0.35 by 0.45, and above the band's top (0.55) by 0.25.
    c, r = torch.tensor([-1.2], dtype=torch.float64), torch.tensor([-2.0], dtype=torch.float64)
    expected = {
        "sigmoid": -math.log(1 / (1 + math.exp(-1.1 * 0.45))),
        "hinge": 0.0,
        "ipo": (1.1 * 0.45) ** 2,
        "smooth_lower_bound": 0.0,
        "smooth_double_bound": (1.1 * 0.25) ** 2,
    }
    for loss_type, value in expected.items():
        s = Smpo(loss_type=loss_type)  # the toolkit's defaults: beta 1.1, margins 0.35 / 0.2
        assert float(smpo.preference_losses(c, r, s)[0]) == pytest.approx(value, abs=1e-12)
    # The SFT term: 0.75 of the chosen's mean NLL and 0.25 of the rejected's.
    assert float(smpo.sft_losses(c, r, Smpo())[0]) == pytest.approx(0.75 * 1.2 + 0.25 * 2.0)


def pairs(tok: Any) -> list[dpo_data.Pair]:
    rows = [
        (formats.pair({"prompt": p, "chosen": c, "rejected": r}, f"row {i}"), f"row {i}")
        for i, (p, c, r) in enumerate(PAIRS)
    ]
    out, dropped = dpo_data.encode(rows, tok, max_len=128)
    assert dropped == 0
    return out


def mean_logprob(model: BigramModel, tok: Any, user: str, answer: str) -> float:
    """The response's mean token log-probability, from the unpadded text alone."""
    ids = chat_ids(tok, chat(user, answer))
    positions = answer_positions(tok, ids, answer)
    return sum(model.logprob_of(ids, j) for j in positions) / len(positions)


class Counting(BigramModel):
    def __init__(self, vocab: int, seed: int) -> None:
        super().__init__(vocab, seed)
        self.rows: list[int] = []

    def forward(self, input_ids: torch.Tensor, **kw: Any) -> Any:
        self.rows.append(input_ids.shape[0])
        return super().forward(input_ids, **kw)


def test_simpo_through_the_method_normalises_by_length(tokenizer: Any) -> None:
    s = Simpo(beta=2.0, gamma=0.5)
    model = Counting(tokenizer.vocab_size, seed=4)
    batch = preference.collate(pairs(tokenizer), tokenizer.pad_id)
    total, extra = simpo.make(s)(model, batch, None)
    means = [
        (mean_logprob(model, tokenizer, p, c), mean_logprob(model, tokenizer, p, r))
        for p, c, r in PAIRS
    ]
    expected = sum(simpo_by_hand(c, r, s.beta, s.gamma) for c, r in means)
    assert float(total.detach()) == pytest.approx(expected, rel=1e-5)
    assert float(extra["reward_acc"]) == sum(c > r for c, r in means)
    assert model.rows == [2 * len(PAIRS)]  # one forward: chosen and rejected together


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_smpo_through_the_method(tokenizer: Any, loss_type: str) -> None:
    s = Smpo(loss_type=loss_type, margin_min=0.1)
    model = Counting(tokenizer.vocab_size, seed=5)
    batch = preference.collate(pairs(tokenizer), tokenizer.pad_id)
    total, extra = smpo.make(s)(model, batch, None)
    means = [
        (mean_logprob(model, tokenizer, p, c), mean_logprob(model, tokenizer, p, r))
        for p, c, r in PAIRS
    ]
    expected = sum(smpo_by_hand(c, r, s) for c, r in means)
    assert float(total.detach()) == pytest.approx(expected, rel=1e-5)
    sft = sum(-(0.75 * c + 0.25 * r) for c, r in means)
    assert float(extra["sft_loss"]) == pytest.approx(sft, rel=1e-5)
    assert model.rows == [2 * len(PAIRS)]


def test_the_family_shares_one_forward_in_fp32_and_only_dpo_reads_a_reference(
    tokenizer: Any,
) -> None:
    model = Counting(tokenizer.vocab_size, seed=6)
    batch = preference.collate(pairs(tokenizer), tokenizer.pad_id)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sums, counts = preference.logprobs(model, batch)
    assert sums.dtype == counts.dtype == torch.float32
    prepare, loss = dpo.make(config.Dpo())
    (ref,) = prepare(model, model, [batch])
    loss(model, batch, ref)
    assert model.rows == [6, 6, 6]  # DPO: one reference forward, one policy forward
    for method, example in (
        ("preference/dpo", "dpo"),
        ("preference/simpo", "simpo"),
        ("preference/smpo", "smpo"),
    ):
        from halo.train.methods import registry

        module = __import__(registry.default().get(method).module, fromlist=["build"])
        cfg = config.load(EXAMPLES / example / "config.yaml", method)
        m = module.build(cfg, tokenizer)
        assert m.needs_reference == (method == "preference/dpo"), method
        assert m.items and isinstance(m.items[0], dpo_data.Pair)


def test_simpo_matches_trl_where_trl_is_installed() -> None:
    pytest.importorskip("trl", reason="TRL is not in this stack (checked where it is)")
    try:
        from trl.experimental.cpo import CPOTrainer
    except ImportError:
        from trl import CPOTrainer
    from types import SimpleNamespace

    c = torch.tensor([m[0] for m in MEANS])
    r = torch.tensor([m[1] for m in MEANS])
    trainer = SimpleNamespace(  # what CPOTrainer.cpo_loss reads of itself
        beta=2.0, simpo_gamma=0.5, loss_type="simpo", label_smoothing=0.0, alpha=0.0,
        accelerator=SimpleNamespace(device=torch.device("cpu")),
    )  # fmt: skip
    losses, _, _ = CPOTrainer.cpo_loss(trainer, c, r)
    assert torch.allclose(losses, simpo.losses(c, r, Simpo(beta=2.0, gamma=0.5)))


def per_epoch(rows: list[dict[str, Any]], key: str, per: int = 4) -> list[float]:
    values = [r[key] for r in rows if key in r]
    return [sum(values[i : i + per]) / per for i in range(0, len(values), per)]


# The examples as they are: 32 pairs, 8 per step, 6 epochs. Measured on seeds 0 and 1: SimPO's
# epoch-mean loss 1.49 -> 0.58 and 1.39 -> 0.54, its reward accuracy 0.31 -> 0.88 and 0.66 ->
# 0.84; SMPO's 5.4 -> 2.4 and 5.4 -> 2.3 (mostly its SFT term).
@pytest.mark.parametrize(
    ("method", "example", "fall", "accuracy"),
    [("preference/simpo", "simpo", 0.5, 0.75), ("preference/smpo", "smpo", 2.0, 0.6)],
)
def test_the_example_trains_with_a_falling_loss(
    tmp_path: Path, method: str, example: str, fall: float, accuracy: float
) -> None:
    rc, out = train_here(method, EXAMPLES / example / "config.yaml", tmp_path)
    assert rc == 0, out
    assert "no reference model" in out, out
    rows = metrics(tmp_path, f"tiny-{example}")
    losses = per_epoch(rows, "loss")
    assert len(losses) == 6 and losses[-1] < losses[0] - fall, losses
    assert per_epoch(rows, "reward_acc")[-1] >= accuracy, per_epoch(rows, "reward_acc")


def test_smpo_without_a_rejected_column_is_one_line(tmp_path: Path) -> None:
    from .test_model_config import main_here, nothing_written

    data = tmp_path / "pairs.jsonl"
    data.write_text('{"prompt": "What is 2 + 2?", "chosen": "4"}\n')
    config_path = EXAMPLES / "smpo" / "config.yaml"
    rc, line = main_here("preference/smpo", config_path, tmp_path, f"--data.train={data}")
    assert rc == 2 and f"{data}:1: rejected: " in line, line
    assert nothing_written(tmp_path / "ck" / "tiny-smpo")


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("--simpo.beta=0", "simpo.beta: Input should be greater than 0"),
        ("--simpo.gamma=.inf", "simpo.gamma: Input should be a finite number"),
        ("--smpo.beta=-1", "smpo.beta: Input should be greater than 0"),
        ("--smpo.margin_min=.nan", "smpo.margin_min: Input should be a finite number"),
        ("--smpo.chosen_sft_ratio=1.5", "smpo.chosen_sft_ratio: Input should be less than"),
        ("--smpo.loss_type=cubic", "smpo.loss_type: Input should be 'sigmoid'"),
    ],
)
def test_method_sections_refuse_out_of_range_values(override: str, expected: str) -> None:
    from halo.errors import HaloError

    section = override.split(".")[0].lstrip("-")
    with pytest.raises(HaloError) as err:
        config.load(EXAMPLES / section / "config.yaml", f"preference/{section}", [override])
    assert expected in err.value.message
