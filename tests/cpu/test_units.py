"""Pure pieces: attention choice, chat mask, model causality, batch order, GRPO maths, launcher."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from halo.errors import HaloError
from halo.train import attention, config, launcher, registry
from halo.train.data import Schedule
from halo.train.methods import grpo
from halo.train.model import Decoder, ModelConfig
from halo.train.tokenizer import Tokenizer, render_chat, show_mask

from .conftest import EXAMPLES

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize(
    ("cap", "mods", "bf16", "want"),
    [
        (None, {"flash_attn", "flash_attn.cute"}, True, "sdpa"),
        ((10, 0), {"flash_attn.cute", "flash_attn"}, True, "fa4"),
        ((10, 0), {"flash_attn"}, True, "fa2"),
        ((9, 0), {"flash_attn_interface", "flash_attn"}, True, "fa3"),
        ((9, 0), {"flash_attn.cute", "flash_attn"}, True, "fa2"),
        ((8, 0), {"flash_attn_interface"}, True, "sdpa"),
        ((9, 0), {"flash_attn_interface"}, False, "sdpa"),
        ((7, 5), set(), True, "sdpa"),
    ],
)
def test_attention_selection(
    cap: tuple[int, int] | None, mods: set[str], bf16: bool, want: str
) -> None:
    choice = attention.select("auto", cap, mods.__contains__, half_precision=bf16)
    assert choice.backend == want
    assert choice.reason


def test_attention_explicit_request_falls_back_with_reason() -> None:
    choice = attention.select("fa3", (9, 0), lambda m: False)
    assert choice.backend == "sdpa" and "flash_attn_interface is not importable" in choice.reason


def test_chat_mask_covers_exactly_the_assistant_turns() -> None:
    tok = Tokenizer()
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi?"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    ids, train = render_chat(tok, msgs)
    assert len(ids) == len(train)
    shown = show_mask(tok, ids, train)
    assert shown == (
        "<|bos|><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n"
        "<|im_start|>assistant\n[[Hello.<|im_end|>]]\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n[[4<|im_end|>]]\n"
    )
    trained = [i for i, t in zip(ids, train, strict=True) if t]
    end = tok.special("<|im_end|>")
    assert trained == [*tok.encode("Hello."), end, *tok.encode("4"), end]
    with pytest.raises(HaloError, match=r"messages\[0\]"):
        render_chat(tok, [{"role": "robot", "content": "x"}])


def test_model_is_causal_and_uses_gqa() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, max_seq_len=16
    )
    model = Decoder(cfg).eval()
    assert model.layers[0].attn.k_proj.out_features == 2 * cfg.head_dim
    x = torch.randint(0, 256, (2, 10))
    y = x.clone()
    y[:, 6:] = torch.randint(0, 256, (2, 4))
    with torch.no_grad():
        a, b = model(x), model(y)
    assert a.shape == (2, 10, 300)
    assert torch.allclose(a[:, :6], b[:, :6], atol=1e-6)
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_schedule_is_deterministic_and_shards_cover_the_global_batch() -> None:
    s = Schedule(n_items=20, global_batch=8, seed=3, epochs=2, max_steps=None)
    assert s.steps_per_epoch == 2 and s.total_steps == 4
    for step in range(s.total_steps):
        whole = s.batch(step)
        assert s.batch(step, 0, 2) + s.batch(step, 1, 2) == whole
        assert len(set(whole)) == 8
    assert s.order(0) == Schedule(20, 8, 3, 2, None).order(0)
    assert s.order(0) != s.order(1)
    with pytest.raises(HaloError, match="larger than"):
        Schedule(4, 8, 0, 1, None)


def test_group_relative_advantages() -> None:
    adv = grpo.advantages([1.0, 0.0, 0.0, 0.0], eps=0.0)
    assert adv[0] == pytest.approx(3**0.5) and adv[1] == pytest.approx(-(3**0.5) / 3)
    assert sum(adv) == pytest.approx(0.0)
    assert grpo.advantages([1.0, 1.0], eps=1e-6) == [0.0, 0.0]


def test_grpo_loss_clips_the_ratio() -> None:
    g = config.Grpo(clip_eps=0.2, kl_coef=0.0, old_policy="current")
    _, loss = grpo.make(g)

    class Fixed(torch.nn.Module):
        def __init__(self, logits: torch.Tensor) -> None:
            super().__init__()
            self.logits = logits

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.logits

    # One sequence, one token; new prob of the target 0.9 vs old 0.5: ratio 1.8.
    logits = torch.log(torch.tensor([[[0.9, 0.1]]]))
    batch = {
        "input_ids": torch.zeros(1, 1, dtype=torch.long),
        "targets": torch.zeros(1, 1, dtype=torch.long),
        "weights": torch.ones(1, 1),
        "advantages": torch.tensor([1.0]),
    }
    old = torch.log(torch.tensor([[0.5]]))
    s, extra = loss(Fixed(logits), batch, {"old": old, "ref": None})
    assert s.item() == pytest.approx(-1.2)  # clipped at 1 + eps for a positive advantage
    assert extra["clip_frac"].item() == 1.0
    batch["advantages"] = torch.tensor([-1.0])
    s, _ = loss(Fixed(logits), batch, {"old": old, "ref": None})
    assert s.item() == pytest.approx(1.8)  # the pessimistic (unclipped) side for a negative one


def test_registry_nested_names_and_errors() -> None:
    reg = registry.default()
    assert {"sft", "offline-grpo", "preference/dpo"} <= set(reg.names())
    assert reg.names("preference") == ["preference/dpo"]
    with pytest.raises(HaloError, match="unknown"):
        reg.get("ppo")
    with pytest.raises(ValueError, match="lower-case"):
        registry.Registry((registry.MethodSpec("Bad Name", "m", "s"),))


def test_launcher_commands(tmp_path: Path) -> None:
    cfg_path = EXAMPLES / "sft" / "config.yaml"
    cfg = config.load(cfg_path, "sft")
    spec = registry.default().get("sft")
    one = launcher.plan(spec, cfg, cfg_path, 1, ["--lr=1"], "/py", accelerate_installed=False)
    assert one.launcher == "python"
    assert one.argv == [
        "/py",
        "-m",
        "halo.train.run",
        "--method",
        "sft",
        "--config",
        str(cfg_path),
        "--lr=1",
    ]
    two = launcher.plan(spec, cfg, cfg_path, 2, [], "/py", accelerate_installed=False)
    assert two.argv[:6] == [
        "/py",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--local-addr=127.0.0.1",
        "--nproc-per-node=2",
    ]
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        assert two.env["GLOO_SOCKET_IFNAME"] == "lo"  # no hostname lookup in a --network none box
    assert "GLOO_SOCKET_IFNAME" not in one.env
    cfg.runtime.launcher = "accelerate"
    with pytest.raises(HaloError, match="accelerate package is not installed"):
        launcher.plan(spec, cfg, cfg_path, 2, [], "/py", accelerate_installed=False)
    acc = launcher.plan(spec, cfg, cfg_path, 2, [], "/py", accelerate_installed=True)
    assert acc.argv[:4] == ["/py", "-m", "accelerate.commands.launch", "--num_processes=2"]
    cfg.runtime.launcher = "auto"
    cfg.runtime.devices = [0, 1]
    assert (
        launcher.plan(spec, cfg, cfg_path, 2, [], "/py", False).env["CUDA_VISIBLE_DEVICES"] == "0,1"
    )
