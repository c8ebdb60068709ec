"""The GPU benchmark's code on the CPU: the same measurement on a tiny model, and the no-GPU
path that must say so instead of pretending."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from halo.train.measure import gpubench

pytestmark = pytest.mark.cpu

TINY = {**gpubench.LLAMA_1B, "vocab_size": 512, "hidden_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "intermediate_size": 256}  # fmt: skip


def test_the_benchmark_measures_both_sides_at_each_length() -> None:
    r = gpubench.measure((32, 64), steps=1, warmup=1, conf=TINY, tokens_per_step=128, device="cpu")
    assert [p["seq_len"] for p in r["points"]] == [32, 64]
    assert [p["batch"] for p in r["points"]] == [4, 2]
    for p in r["points"]:
        assert p["trainer"]["tokens_per_s"] > 0 and p["plain"]["tokens_per_s"] > 0
        assert p["trainer"]["mfu"] is None  # no known peak for a CPU: no made-up MFU
    assert r["attention"] == "sdpa"
    rows = gpubench.rows(r)
    assert len(rows) == 2 and all(b == ">= 0.95x" for _, _, b, _ in rows)


def test_flops_follow_torchtitans_count() -> None:
    conf = gpubench.LLAMA_1B
    n = 1_100_000_000
    per_token = gpubench.flops_per_token(conf, n, 2048)
    embedding = conf["vocab_size"] * conf["hidden_size"]
    assert per_token == 6 * (n - embedding) + 12 * 16 * 32 * 64 * 2048
    assert gpubench.peak_flops("NVIDIA H200") == 989e12
    assert gpubench.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert gpubench.peak_flops("some other GPU") is None


def test_without_a_gpu_it_says_so_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    assert gpubench.main(["--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].startswith("gpu bench: skipped: no GPU (")
    assert "skipped: no GPU" in printed and "torchtitan" in printed
    assert json.loads(out.read_text())["skipped"].startswith("no GPU")
