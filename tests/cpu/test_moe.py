"""The MoE block halo trains, in one process, against transformers' own.

halo.train.models.moe replaces transformers' Qwen3-MoE and gpt-oss blocks with blocks that
route through the EP dispatch/combine interface and compute experts with a grouped matmul.
Here each is pinned to transformers: the same logits, the same load-balancing loss, the same
gradients of transformers' own training loss (cross-entropy + router_aux_loss_coef x aux),
for the grouped matmul and for its loop reference; and the trainer's real backward (halo's
loop, not the block alone) gives transformers' gradient, so a routing loss left out of the
step is caught, not only one left out of the block.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from halo.train.models import grouped, moe

from .conftest import EXAMPLES

pytestmark = pytest.mark.cpu

MOE = EXAMPLES / "moe" / "config.yaml"
COMMON = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_experts_per_tok": 2,
    "vocab_size": 100,
    "max_position_embeddings": 64,
    "router_aux_loss_coef": 0.05,
}
FAMILIES = {
    "qwen3_moe": {"num_experts": 4, "moe_intermediate_size": 32, "norm_topk_prob": True},
    "gpt_oss": {
        "num_local_experts": 4,
        "intermediate_size": 32,
        "head_dim": 32,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 16,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    },
}


def hf_model(family: str) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    conf = AutoConfig.for_model(family, **COMMON, **FAMILIES[family])
    torch.manual_seed(0)
    impl = "eager" if family == "gpt_oss" else "sdpa"  # gpt-oss's sinks: eager attention
    model = AutoModelForCausalLM.from_config(conf, attn_implementation=impl, dtype=torch.float32)
    with torch.no_grad():  # routers start at zero in transformers: give them something to do
        for name, p in model.named_parameters():
            if ".gate." in name or ".router." in name:
                p.normal_(0, 0.5)
    return model


@pytest.mark.parametrize("impl", ["grouped", "loop"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_block_gives_transformers_logits_aux_loss_and_gradients(family: str, impl: str) -> None:
    reference = hf_model(family)
    ours = copy.deepcopy(reference)
    blocks = moe.adapt(ours, moe.Routing(num_experts=4, aux_coef=COMMON["router_aux_loss_coef"]))
    assert len(blocks) == 2
    for b in blocks:
        b.experts.impl = impl
    # The same parameters under the same names: checkpoints stay transformers' own.
    assert dict(ours.state_dict()).keys() == dict(reference.state_dict()).keys()
    ids = torch.randint(0, 100, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[2, 7:] = 0  # a padded row: its pads count in no routing statistic
    theirs = reference(input_ids=ids, attention_mask=mask, labels=ids, output_router_logits=True)
    moe.begin(ours, mask)
    mine = ours(input_ids=ids, attention_mask=mask, labels=ids)
    routing = moe.router_loss(ours, micro_batches=1)
    assert routing is not None
    torch.testing.assert_close(mine.logits, theirs.logits, atol=1e-5, rtol=1e-5)
    stats = moe.step_stats(ours)
    assert stats["moe_aux_loss"] == pytest.approx(float(theirs.aux_loss.detach()), abs=1e-5)
    (mine.loss + routing).backward()
    theirs.loss.backward()
    grads = dict(ours.named_parameters())
    for name, p in reference.named_parameters():
        torch.testing.assert_close(grads[name].grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_matmul_matches_the_loop_reference(dtype: torch.dtype) -> None:
    if not grouped.available(torch.device("cpu"), dtype):
        pytest.skip(f"torch._grouped_mm does not run on this CPU for {dtype}")
    g = torch.Generator().manual_seed(0)
    counts = [3, 0, 5, 1]  # an expert with no rows too
    x = torch.randn(sum(counts), 16, generator=g).to(dtype).requires_grad_()
    w = torch.randn(4, 16, 8, generator=g).to(dtype).requires_grad_()
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    a, b = grouped.grouped(x, w, counts), grouped.loop(x2, w2, counts)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 5e-2, "rtol": 2e-2}
    torch.testing.assert_close(a, b, **tol)
    a.sum().backward()  # a sum's gradient is expanded (stride 0): grouped_mm needs it whole
    b.sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, **tol)
    torch.testing.assert_close(w.grad, w2.grad, **tol)


def _trainer(*extra: str) -> Any:
    from halo.train import config
    from halo.train.data import tokenizer as tk
    from halo.train.loop import setup
    from halo.train.methods import sft
    from halo.train.parallel import distributed

    cfg = config.load(MOE, "sft", ["--training.max_steps=1", *extra])
    tok = tk.for_config(cfg)
    method = sft.build(cfg, tok)
    ctx = distributed.Context(0, 1, 0, torch.device("cpu"))
    return setup.setup(cfg, method, tok, ctx, total_steps=1)


def test_the_trainers_step_takes_the_load_balancing_loss_with_its_coefficient() -> None:
    """halo's loop backward == transformers' gradient of CE + router_aux_loss_coef x aux."""
    from transformers import AutoModelForCausalLM

    from halo.train.data.batching import Schedule
    from halo.train.loop import loop

    tr = _trainer()
    coef = tr.conf.router_aux_loss_coef
    assert coef > 0
    reference = AutoModelForCausalLM.from_config(tr.conf, attn_implementation="sdpa")
    reference.load_state_dict(tr.model.state_dict())
    sched = Schedule(len(tr.method.items), 8, 0, 1, 1)
    items = [tr.method.items[i] for i in sched.global_batch_of(0)]
    batches, prepared, count = loop.prepare(tr, items)
    loop.backward(tr, batches, prepared, count)
    (b,) = batches
    labels = torch.where(b["weights"] > 0, b["targets"], -100)
    out = reference(
        input_ids=b["input_ids"],
        attention_mask=b["attention_mask"],
        output_router_logits=True,
        use_cache=False,
    )
    # transformers' loss shifts labels itself; the trainer's targets are already shifted.
    ce = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), labels.flatten())
    (ce + coef * out.aux_loss).backward()
    ours = dict(tr.model.named_parameters())
    router = "model.layers.0.mlp.gate.weight"
    torch.testing.assert_close(
        ours[router].grad, dict(reference.named_parameters())[router].grad, atol=1e-6, rtol=1e-4
    )
    for name, p in reference.named_parameters():
        torch.testing.assert_close(ours[name].grad, p.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_the_routing_log_says_how_loaded_each_expert_is() -> None:
    from halo.train.loop import loop

    tr = _trainer("--logging.every_steps=1")
    items = tr.method.items[:8]
    st = loop.step(tr, items)
    for key in ("moe_aux_loss", "moe_load_max", "moe_load_min", "moe_layer_load_max"):
        assert key in st.extras, st.extras
    assert st.extras["moe_load_min"] <= 1.0 <= st.extras["moe_load_max"]
    # 4 experts, top 2, balanced: Switch's loss is top_k = 2 at perfect balance.
    assert 1.9 < st.extras["moe_aux_loss"] < 4.0


def test_the_gpu_benchs_moe_row_measures_the_trainers_step() -> None:
    """halo/train/measure/gpubench.py's MoE row (what the device check runs on a GPU), on a tiny
    Qwen3-MoE on the CPU: tokens/s per GPU from the trainer's step, and no made-up MFU."""
    from halo.train.measure import gpubench

    tiny = {**gpubench.QWEN3_30B_A3B, "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "moe_intermediate_size": 32,
            "num_experts": 4, "num_experts_per_tok": 2}  # fmt: skip
    r = gpubench.measure_moe(
        tiny, seq_len=32, batch=2, steps=1, warmup=1, device="cpu", stray={"head_dim": 16}
    )
    assert r["tokens_per_s_per_gpu"] > 0 and r["mfu"] is None and (r["ep"], r["tp"]) == (1, 1)
    ((name, measured, _, ok),) = gpubench.moe_rows([r], "; one GPU here: no EP/TP rows")
    assert "Qwen3-30B-A3B-shaped (2 of 48 layers)" in name and "one GPU" in name and ok
    assert measured.endswith("one GPU here: no EP/TP rows")
    # The full shape: what one 80 GB GPU fits, and EP 8 spreading the experts.
    assert gpubench.moe_layers_that_fit(gpubench.QWEN3_30B_A3B, 78e9) >= 1
    assert gpubench.moe_layers_that_fit(gpubench.QWEN3_30B_A3B, 78e9, ep=8) > 4
    # 6 x active parameters (3.04B with the LM head, head_dim 128) + attention at 2048.
    per_token = gpubench.moe_flops_per_token(gpubench.QWEN3_30B_A3B, 2048)
    assert 6 * 3.0e9 < per_token < 6 * 3.1e9 + 12 * 48 * 32 * 128 * 2048


def test_the_z_loss_is_the_mean_squared_log_sum_exp_of_the_router_logits() -> None:
    reference = hf_model("qwen3_moe")
    ours = copy.deepcopy(reference)
    moe.adapt(ours, moe.Routing(num_experts=4, aux_coef=0.0, z_coef=0.1))
    ids = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(2))
    logits = torch.cat(reference(input_ids=ids, output_router_logits=True).router_logits)
    want = torch.logsumexp(logits.float(), dim=-1).pow(2).mean()  # ST-MoE, all layers pooled
    moe.begin(ours)
    ours(input_ids=ids)
    loss = moe.router_loss(ours, micro_batches=1)
    assert loss is not None
    torch.testing.assert_close(loss.detach(), 0.1 * want.detach(), atol=1e-6, rtol=1e-5)
    assert moe.step_stats(ours)["moe_z_loss"] == pytest.approx(float(want.detach()), rel=1e-5)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_trains_and_exports_what_transformers_loads(family: str, tmp_path: Any) -> None:
    """Through the trainer (run.run in this process): a few steps of each MoE family, then its
    checkpoint exported and loaded by transformers, with the trainer's blocks' logits."""
    import json

    from transformers import AutoModelForCausalLM

    from halo.train.checkpoints import checkpoint
    from halo.train.checkpoints.export import export

    from .conftest import train_here

    fields = {"model_type": family, **COMMON, **FAMILIES[family], "vocab_size": 400}
    rc, out = train_here(
        "sft", MOE, tmp_path, f"--model.config={json.dumps(fields)}", "--training.max_steps=3"
    )
    assert rc == 0, out
    assert "moe_aux_loss" in out
    found = checkpoint.latest(tmp_path / "ck" / "tiny-moe")
    assert found is not None
    folder = export(found.path, tmp_path / "export")
    theirs = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    ours = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    moe.adapt(ours, moe.Routing(num_experts=4))
    ids = torch.arange(30).reshape(2, 15) % 300
    with torch.no_grad():
        torch.testing.assert_close(
            ours(input_ids=ids).logits, theirs(input_ids=ids).logits, atol=1e-5, rtol=1e-5
        )
