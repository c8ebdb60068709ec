"""Pure pieces: attention choice, formats, chat masks, packing, batch order, launcher, caches."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from halo.errors import HaloError
from halo.train import config
from halo.train.checkpoints import export
from halo.train.data import batching, examples, formats
from halo.train.data.batching import Schedule
from halo.train.launch import launcher
from halo.train.methods import registry
from halo.train.models import attention, hfcache

from .conftest import EXAMPLES, TINY, TOKENIZER

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


def test_attention_backends_map_to_transformers_implementations() -> None:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from halo.train.models.hf import ATTN_IMPLEMENTATION

    assert set(ATTN_IMPLEMENTATION) == set(attention.BACKENDS)
    for impl in ATTN_IMPLEMENTATION.values():
        assert impl == "sdpa" or impl in ALL_ATTENTION_FUNCTIONS.valid_keys(), impl


def test_attention_explicit_request_falls_back_with_reason() -> None:
    choice = attention.select("fa3", (9, 0), lambda m: False)
    assert choice.backend == "sdpa" and "flash_attn_interface is not importable" in choice.reason


MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Hi?"}]},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
]


def test_chat_mask_covers_exactly_the_assistant_turns(tokenizer: Any) -> None:
    r = tokenizer.render(formats.messages(MESSAGES, "m"))
    assert len(r.ids) == len(r.train)
    assert tokenizer.show_mask(r) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n"
        "<|im_start|>assistant\n[[Hello.<|im_end|>]]\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n[[4<|im_end|>]]\n"
    )
    # A template without generation blocks: the same mask, found by rendering prefixes.
    from halo.train.data.tokenizer import ChatTokenizer

    plain = tokenizer.hf.chat_template.replace("{%- generation -%}", "").replace(
        "{%- endgeneration -%}", ""
    )
    hf = type(tokenizer.hf).from_pretrained(str(TOKENIZER))
    hf.chat_template = plain
    other = ChatTokenizer(hf, "plain")
    assert not other._marked
    assert other.render(formats.messages(MESSAGES, "m")).train == r.train
    with pytest.raises(HaloError, match=r"m\[0\].role: expected one of"):
        formats.messages([{"role": "robot", "content": "x"}], "m")


def test_sharegpt_tags_map_like_llama_factory() -> None:
    row = {
        "dialog": [
            {"speaker": "U", "text": "Add 2 and 3."},
            {"speaker": "FN", "text": json.dumps({"name": "add", "arguments": {"a": 2, "b": 3}})},
            {"speaker": "OBS", "text": "5"},
            {"speaker": "A", "text": "5."},
        ],
        "sys": "You add.",
    }
    chat = formats.sharegpt(
        row,
        "r:1",
        {"messages": "dialog", "system": "sys"},
        {
            "role_tag": "speaker",
            "content_tag": "text",
            "user_tag": "U",
            "assistant_tag": "A",
            "function_tag": "FN",
            "observation_tag": "OBS",
        },
    )
    assert [m["role"] for m in chat.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert chat.messages[2]["tool_calls"][0]["function"] == {
        "name": "add",
        "arguments": {"a": 2, "b": 3},
    }
    with pytest.raises(HaloError, match=r"r:1: dialog\[0\].speaker: expected one of"):
        formats.sharegpt(
            {"dialog": [{"speaker": "?", "text": "x"}]},
            "r:1",
            {"messages": "dialog"},
            {"role_tag": "speaker", "content_tag": "text"},
        )


def test_prompt_completion_and_preference_rows() -> None:
    pc = formats.chat({"prompt": "Q", "completion": "A"}, "prompt_completion", "r", {}, {})
    assert pc.train_from == 1 and pc.messages[-1] == {"role": "assistant", "content": "A"}
    conv = formats.pair(
        {
            "chosen": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "good"}],
            "rejected": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "bad"}],
        },
        "r",
    )
    assert conv.prompt == [{"role": "user", "content": "Q"}]
    assert conv.chosen[0]["content"] == "good" and conv.rejected[0]["content"] == "bad"
    with pytest.raises(HaloError, match="completions\\[1\\]: expected"):
        formats.group(
            {
                "prompt": "Q",
                "completions": [{"text": "a", "reward": 1}, {"text": "b", "reward": float("nan")}],
            },
            "r",
        )
    with pytest.raises(HaloError, match="cannot tell the format"):
        formats.detect({"text": "x"}, {})


def test_packed_rows_give_each_example_its_own_attention(tokenizer: Any) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from halo.train.models.hf import logits

    fields = {k: v for k, v in TINY["llama"].items() if k != "model_type"}
    conf = AutoConfig.for_model("llama", vocab_size=tokenizer.vocab_size, **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(conf, attn_implementation="sdpa").eval()
    seqs = [
        examples.Sequence([5, 6, 7], [6, 7, 8], [1, 1, 1]),
        examples.Sequence([9, 10], [10, 11], [1, 1]),
    ]
    with torch.no_grad():
        packed = logits(model, batching.pack(seqs))[0]
        padded = logits(model, batching.pad(seqs, tokenizer.pad_id))
    torch.testing.assert_close(packed[:3], padded[0, :3], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[3:], padded[1, :2], atol=1e-5, rtol=0)


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


def test_interleave_follows_the_probabilities_until_a_source_runs_out() -> None:
    a, b = [("a", i) for i in range(900)], [("b", i) for i in range(100)]
    mixed = batching.interleave([a, b], [0.9, 0.1], seed=0)
    share_b = sum(1 for s, _ in mixed if s == "b") / len(mixed)
    assert 0.07 < share_b < 0.13
    assert [i for s, i in mixed if s == "a"] == list(range(sum(1 for s, _ in mixed if s == "a")))
    assert mixed == batching.interleave([a, b], [0.9, 0.1], seed=0)


def test_parquet_and_jsonl_read_the_same_rows(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": "Q1", "completion": "A1"}, {"prompt": "Q2", "completion": "A2"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = [
        [r.data for r in examples.read_rows(tmp_path / f"d.{ext}")] for ext in ("parquet", "jsonl")
    ]
    assert got[0] == got[1] == rows
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(HaloError, match="not a readable Parquet file"):
        examples.read_rows(tmp_path / "bad.parquet")


def test_tokenizer_is_rebuilt_identically_from_the_shipped_data(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tokenizer", EXAMPLES / "make_tokenizer.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build(tmp_path)
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (tmp_path / name).read_bytes() == (TOKENIZER / name).read_bytes(), name


def test_hf_cache_seed_places_verified_files_transformers_can_read(tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    cache = tmp_path / "hub"
    placed = hfcache.seed(EXAMPLES / "hf-cache.toml", None, cache)
    assert {p.source for p in placed} == {"local"}
    again = hfcache.seed(EXAMPLES / "hf-cache.toml", None, cache)
    assert {p.source for p in again} == {"cached"}
    old = os.environ.get("HF_HUB_CACHE")
    os.environ["HF_HUB_CACHE"] = str(cache)
    try:
        conf = AutoConfig.from_pretrained(
            "halo-examples/tiny-qwen3", local_files_only=True, cache_dir=str(cache)
        )
        tok = AutoTokenizer.from_pretrained(
            "halo-examples/tiny-llama", local_files_only=True, cache_dir=str(cache)
        )
    finally:
        if old is None:
            os.environ.pop("HF_HUB_CACHE")
        else:
            os.environ["HF_HUB_CACHE"] = old
    assert conf.model_type == "qwen3" and conf.head_dim == 64
    assert tok.chat_template and "generation" in tok.chat_template
    # A file whose bytes do not match its pin is refused and not placed.
    bad = tmp_path / "list.toml"
    text = (EXAMPLES / "hf-cache.toml").read_text().replace('local = "', f'local = "{EXAMPLES}/')
    text = re.sub(r'"config.json" = "[0-9a-f]{64}"', '"config.json" = "' + "0" * 64 + '"', text)
    bad.write_text(text)
    with pytest.raises(HaloError, match=r"config.json: sha256 .* expected 0{64}; not placed"):
        hfcache.seed(bad, None, tmp_path / "other")
    assert not list((tmp_path / "other").rglob("config.json"))


def test_sharded_export_loads_in_transformers(tmp_path: Path, tokenizer: Any) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in TINY["qwen3"].items() if k != "model_type"}
    conf = AutoConfig.for_model("qwen3", vocab_size=tokenizer.vocab_size, **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(conf).eval()
    export.write_hf(tmp_path, model.state_dict(), conf, tokenizer, max_shard_bytes=200_000)
    index = json.loads((tmp_path / export.INDEX).read_text())
    assert len(set(index["weight_map"].values())) > 2
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    ids = torch.tensor([[1, 5, 9, 30]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_qwen2_keeps_its_qkv_bias(tokenizer: Any) -> None:
    from halo.train.models import hf

    m = config.Model(config={**TINY["llama"], "model_type": "qwen2"}, tokenizer=str(TOKENIZER))
    built = hf.build(m, hf.hf_config(m, tokenizer), "sdpa", 0)
    names = {n for n, _ in built.named_parameters()}
    assert "model.layers.0.self_attn.q_proj.bias" in names


def test_registry_nested_names_and_errors() -> None:
    reg = registry.default()
    assert {"sft", "offline-grpo", "preference/dpo"} <= set(reg.names())
    assert reg.names("preference") == ["preference/dpo", "preference/simpo", "preference/smpo"]
    with pytest.raises(HaloError, match="unknown"):
        reg.get("ppo")
    with pytest.raises(ValueError, match="lower-case"):
        registry.Registry((registry.MethodSpec("Bad Name", "m", "s"),))


def test_launcher_commands() -> None:
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


def test_grpo_policy_update_is_reusable_on_rollouts_and_exports_for_serving(tmp_path: Path) -> None:
    """What online GRPO calls: a Trainer, one update on (prompt, completions, rewards), an export."""
    from transformers import AutoModelForCausalLM

    from halo.train.data import tokenizer as tk
    from halo.train.loop import saving, setup
    from halo.train.methods import grpo
    from halo.train.parallel import distributed

    cfg = config.load(EXAMPLES / "grpo" / "config.yaml", "offline-grpo", [
        f"--runtime.paths.checkpoints={tmp_path / 'ck'}", "--model.activation_checkpointing=true",
    ])  # fmt: skip
    tok = tk.for_config(cfg)
    method = grpo.method(cfg, tok, items=[])
    tr = setup.setup(cfg, method, tok, distributed.Context(0, 1, 0, torch.device("cpu")), 10)
    assert tr.model.is_gradient_checkpointing
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    rollouts = [
        formats.GroupRow(
            [{"role": "user", "content": "What is 2 + 2?"}], ["4", "5", "22"], [1.0, 0.0, 0.0]
        ),
        formats.GroupRow(
            [{"role": "user", "content": "What is 1 + 3?"}], ["4", "13", "2"], [1.0, 0.0, 0.0]
        ),
    ]
    stats = grpo.policy_update(tr, rollouts * 2)  # global batch: 4 groups
    assert tr.step == 1 and stats.tokens > 0 and stats.extras["clip_frac"] == 0.0
    out = saving.export_model(tr, tmp_path / "served")
    assert out is not None
    loaded = AutoModelForCausalLM.from_pretrained(str(out))
    changed = [
        k for k, v in loaded.state_dict().items() if k in before and not torch.equal(v, before[k])
    ]
    assert changed
