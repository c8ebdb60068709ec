"""The mesh before anything runs: sizes from the config and the seed's flags, one line for a
mesh that cannot be, and the memory plan of the seed's recipes at their real sizes, on a
login node without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from halo.errors import HaloError
from halo.train import config
from halo.train.models import source
from halo.train.models.arch import from_config
from halo.train.parallel import dims, plan

from .conftest import EXAMPLES, REPO, halo_env, outputs, run_halo_without

pytestmark = pytest.mark.cpu

MOE = EXAMPLES / "moe" / "config.yaml"
SFT = EXAMPLES / "sft" / "config.yaml"
GPTOSS = EXAMPLES / "sft" / "gptoss" / "gptoss-20b-multinode-ep.yaml"


def load(path: Path, *extra: str) -> Any:
    return config.load(path, "sft", list(extra))


@pytest.mark.parametrize(
    ("world", "extra", "want"),
    [
        (1, [], (1, 1, 1, 1, 1)),
        (8, [], (1, 8, 1, 1, 1)),
        (8, ["--tensor_parallel_size=2"], (1, 4, 1, 2, 1)),
        (8, ["--expert_parallel_size=4"], (1, 8, 1, 1, 4)),
        (8, ["--runtime.parallelism.data_parallel_replicate_size=2", "--expert_parallel_size=2"], (2, 4, 1, 1, 2)),
        (8, ["--runtime.parallel_mode=ddp"], (8, 1, 1, 1, 1)),
        (8, ["--context_parallel_size=2", "--tensor_parallel_size=2"], (1, 2, 2, 2, 1)),
    ],
)  # fmt: skip
def test_the_mesh_takes_what_the_other_dimensions_leave(
    world: int, extra: list[str], want: tuple[int, ...]
) -> None:
    d = dims.resolve(load(MOE, *extra), world)
    assert (d.dp_replicate, d.dp_shard, d.cp, d.tp, d.ep) == want
    assert d.world == world


# (launch arguments, the error line): each before any process starts, exit 2.
BAD = [
    (["--nproc", "3", "--expert_parallel_size", "3", "--", "--training.global_batch_size=12"],
     "runtime.parallelism.expert_parallel_size: 3 does not divide the model's 4 experts"),
    (["--nproc", "2", "--tensor_parallel_size", "2", "--", "--model.config.num_key_value_heads=1"],
     "runtime.parallelism.tensor_parallel_size: 2 does not divide the model's 1 key/value heads"),
    (["--nproc", "2", "--expert_parallel_size", "2", "--tensor_parallel_size", "2"],
     "expert_parallel_size 2 x tensor_parallel_size 2 = 4 is larger than the world of 2"),
    (["--nproc", "2", "--context_parallel_size", "2", "--", "--data.max_seq_len=126"],
     "data.max_seq_len: 126 does not divide by 2 x context_parallel_size = 4"),
    (["--nproc", "4", "--", "--runtime.parallelism.data_parallel_shard_size=3"],
     "dp_shard 3 x cp 1 x tp 1 = 3 does not match the world of 4 processes"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "line"), BAD, ids=["ep-experts", "tp-heads", "ep-tp-world", "cp-seq", "mesh-world"]
)
def test_a_mesh_that_cannot_be_is_one_line_and_exit_2(
    argv: list[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from halo.cli import main

    cut = argv.index("--") if "--" in argv else len(argv)
    args = [
        "launch",
        "sft",
        str(MOE),
        *argv[:cut],
        "--dry-run",
        "--",
        *outputs(tmp_path),
        *argv[cut + 1 :],
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and line in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_a_moe_flag_on_a_dense_model_is_one_line(tmp_path: Path) -> None:
    # On a login node (no torch), as `halo launch` checks it before starting anything.
    r = run_halo_without(
        ["torch"], "launch", "sft", str(SFT), "--nproc", "2", "--expert_parallel_size", "2",
        "--dry-run", "--", *outputs(tmp_path),
    )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    # (transformers' own banner about the missing torch aside)
    ours = [x for x in r.stderr.splitlines() if not x.startswith("[transformers]")]
    assert ours == [
        "halo: error: runtime.parallelism.expert_parallel_size 2: llama is a dense model "
        "(no experts to route)"
    ]
    with pytest.raises(HaloError, match=r"model\.router_z_loss_coef: llama is a dense model"):
        dims.check(load(SFT, "--model.router_z_loss_coef=0.1"), "sft", 1)


def test_the_trainer_refuses_a_bad_mesh_before_its_process_group(tmp_path: Path) -> None:
    """`python -m halo.train.run` under a world of 4 with no rendezvous to join: the check
    comes first (one line, exit 2); a process group would wait for peers that never come."""
    env = halo_env(WORLD_SIZE="4", RANK="0", LOCAL_RANK="0")
    cmd = [sys.executable, "-m", "halo.train.run", "--method", "sft", "--config", str(MOE),
           *outputs(tmp_path), "--expert_parallel_size=3"]  # fmt: skip
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "halo: error: runtime.parallelism.expert_parallel_size: 3 does not divide the data-"
        "parallel shard size 4 (expert parallelism borrows dp_shard ranks; dp_shard = world / "
        "(dp_replicate x cp x tp))"
    ]


def test_a_method_without_a_dimension_says_so() -> None:
    cfg = config.load(
        EXAMPLES / "dpo" / "config.yaml", "preference/dpo", ["--context_parallel_size=2"]
    )
    with pytest.raises(
        HaloError, match=r"preference/dpo trains with dp_replicate dp_shard tp ep, not cp"
    ):
        dims.check(cfg, "preference/dpo", 2)


@pytest.mark.parametrize(
    "fields",
    [
        json.loads((EXAMPLES / "models" / "tiny-qwen3" / "config.json").read_text()),
        {"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
         "intermediate_size": 256, "vocab_size": 400, "tie_word_embeddings": True},
        {**load(MOE).model.config, "vocab_size": 400},
        {"model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
         "vocab_size": 400, "layer_types": ["sliding_attention", "full_attention"]},
    ],
    ids=["qwen3", "llama-tied", "qwen3_moe", "gpt_oss"],
)  # fmt: skip
def test_the_plans_parameter_count_is_transformers(fields: dict[str, Any]) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    rest = {k: v for k, v in fields.items() if k not in ("model_type", "transformers_version")}
    conf = AutoConfig.for_model(fields["model_type"], **rest)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(conf)
    unique = {id(p): p.numel() for p in model.parameters()}  # a tied head counts once
    assert from_config(conf.to_dict()).total_params() == sum(unique.values())


def test_the_seeds_recipe_plans_on_a_login_node_without_torch(tmp_path: Path) -> None:
    """The acceptance command: a complete sbatch script and the memory plan, no torch."""
    r = run_halo_without(
        ["torch"], "launch", "sft", str(GPTOSS), "--nnodes", "2", "--nproc-per-node", "8",
        "--expert_parallel_size", "8", "--slurm", "--dry-run", "--", *outputs(tmp_path),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "torch" not in r.stderr, r.stderr
    script, _, rest = r.stdout.partition("# parallelism\n")
    assert script.startswith("#!/bin/bash\n#SBATCH --job-name=gptoss-20b-sft-ep\n")
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=8" in script
    # Every node's launch carries the flag: the mesh is the same on all of them.
    assert (
        "--nproc-per-node 8" in script and "--runtime.parallelism.expert_parallel_size=8" in script
    )
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert rest.startswith(
        "mesh: dp_replicate 1 x dp_shard 16 x cp 1 x tp 1 = 16 processes; ep 8 within dp_shard "
        "(experts FSDP-sharded over 2)\n"
    ), rest
    assert "model: gpt_oss from openai/gpt-oss-20b" in rest and "32 experts, top 4" in rest
    assert "20.91B parameters, 3.61B active per token" in rest  # OpenAI: 21B, 3.6B active
    for row in (
        "weights (fp32)",
        "gradients (fp32)",
        "optimizer (AdamW, 2 x fp32)",
        "activations",
        "total",
    ):
        assert row in rest, rest
    assert list(tmp_path.iterdir()) == []


def test_the_memory_plan_shards_as_the_mesh_does() -> None:
    cfg = load(GPTOSS)
    a = source.arch(cfg)
    assert a is not None and a.is_moe and a.experts == 32
    one = plan.memory(cfg, dims.Dims(1, 8, 1, 1, 1), a)
    ep = plan.memory(cfg, dims.Dims(1, 8, 1, 1, 8), a)
    # EP 8 on 8 ranks: every expert on one rank only, FSDP2 no longer shards the experts,
    # so each rank holds the same share as FSDP over 8 alone.
    assert ep.params == pytest.approx(one.params, rel=1e-9)
    twice = plan.memory(cfg, dims.Dims(1, 16, 1, 1, 8), a)
    assert twice.params < one.params
    c = a.counts()
    assert twice.params == pytest.approx(
        (c["embeddings"] + c["attention"] + c["router"]) / 16 + c["experts"] / 16
    )
    assert one.weights == 4 * one.params and one.optimizer == 8 * one.params


def test_launch_list_says_which_parallel_dimensions_each_method_takes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from halo.cli import main

    assert main(["launch", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-2:] == ["parallel", "dims"]
    sft = next(x for x in lines if x.startswith("sft "))
    assert sft.split()[-5:] == ["dp_replicate", "dp_shard", "cp", "tp", "ep"]
    dpo = next(x for x in lines if x.startswith("preference/dpo "))
    assert dpo.split()[-4:] == ["dp_replicate", "dp_shard", "tp", "ep"]


def test_the_plan_reads_a_cached_config_json_as_data(tmp_path: Path) -> None:
    """A Hub id in the Hugging Face cache: its config.json, read without transformers."""
    snap = tmp_path / "hub" / "models--someone--tiny-moe"
    (snap / "refs").mkdir(parents=True)
    (snap / "refs" / "main").write_text("0" * 40)
    (snap / "snapshots" / ("0" * 40)).mkdir(parents=True)
    conf = {**load(MOE).model.config, "vocab_size": 400}
    (snap / "snapshots" / ("0" * 40) / "config.json").write_text(json.dumps(conf))
    before = os.environ.get("HF_HUB_CACHE")
    os.environ["HF_HUB_CACHE"] = str(tmp_path / "hub")
    try:
        cfg = config.load(
            MOE, "sft", ["--model.name_or_path=someone/tiny-moe", "--model.config=null"]
        )
        found = source.source(cfg)
    finally:
        if before is None:
            os.environ.pop("HF_HUB_CACHE")
        else:
            os.environ["HF_HUB_CACHE"] = before
    assert found is not None and found.where.endswith("config.json")
    assert from_config(found.conf).experts == 4
