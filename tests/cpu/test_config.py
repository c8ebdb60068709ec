"""Config validation: every problem at once, with its key path; overrides; path resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from halo.errors import HaloError
from halo.train import config, overrides

from .conftest import EXAMPLES, run_halo

pytestmark = pytest.mark.cpu

BROKEN = """
runtime:
  job_name: broken
  paths: {checkpoints: out/ck, logs: out/logs}
  parallel_mode: sideways
model:
  hidden_size: "sixty-four"
data:
  train: missing.jsonl
optim:
  lr: fast
  colour: blue
training:
  global_batch_size: 8
surprise: 1
"""


def write(tmp: Path, text: str) -> Path:
    p = tmp / "cfg.yaml"
    p.write_text(text)
    return p


def test_broken_config_lists_every_problem_with_key_paths(tmp_path: Path) -> None:
    with pytest.raises(HaloError) as err:
        config.load(write(tmp_path, BROKEN), "sft")
    msg = err.value.message
    for expected in (
        "runtime.parallel_mode: expected one of 'auto' or 'none' or 'ddp' or 'fsdp', got 'sideways'",
        "model.hidden_size: expected int, got str 'sixty-four'",
        "optim.lr: expected float, got str 'fast'",
        "optim.colour: unknown key",
        "surprise: unknown key",
        f"data.train: file not found: {tmp_path / 'missing.jsonl'}",
    ):
        assert expected in msg, msg
    assert "6 problems" in msg


def test_broken_config_cli_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    cfg = write(tmp_path, BROKEN)
    before = sorted(tmp_path.rglob("*"))
    for args in (("launch", "sft", str(cfg)), ("preflight", str(cfg))):
        r = run_halo(*args)
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith("halo: error: "), r.stderr
        assert "model.hidden_size: expected int" in r.stderr
        assert "Traceback" not in r.stderr
    assert sorted(tmp_path.rglob("*")) == before


def test_missing_required_and_wrong_nested_types(tmp_path: Path) -> None:
    cfg = write(tmp_path, "runtime: {devices: [0, x], env: {A: [1]}}\ndata: {}\n")
    with pytest.raises(HaloError) as err:
        config.load(cfg, "sft")
    msg = err.value.message
    assert "runtime.job_name: required key is missing" in msg
    assert "data.train: required key is missing" in msg
    assert "runtime.devices: expected 'all' or list of int" in msg
    assert "runtime.env.A: expected a string" in msg


def test_method_sections_belong_to_their_method(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"messages": []}\n')
    cfg = write(
        tmp_path, f"runtime: {{job_name: j}}\ndata: {{train: {data}}}\ngrpo: {{clip_eps: 0.1}}\n"
    )
    with pytest.raises(HaloError, match="grpo: section is for method offline-grpo, not sft"):
        config.load(cfg, "sft")
    assert config.load(cfg, "offline-grpo").grpo.clip_eps == 0.1


def test_paths_are_relative_to_the_yaml_and_overrides_apply() -> None:
    cfg = config.load(
        EXAMPLES / "sft" / "config.yaml", "sft", ["--lr=1e-5", "--training.max_steps=3"]
    )
    assert cfg.data.train == EXAMPLES / "sft" / "train.jsonl"
    assert cfg.runtime.paths.checkpoints == (EXAMPLES / "sft" / "../../runs/checkpoints").resolve()
    assert cfg.optim.lr == 1e-5 and isinstance(cfg.optim.lr, float)
    assert cfg.training.max_steps == 3


def test_yaml_exponent_floats_are_floats() -> None:
    assert config.parse_yaml("lr: 1e-5", "x") == {"lr": 1e-5}


def test_override_keys() -> None:
    assert overrides.resolve_key("lr", config.Config) == "optim.lr"
    assert overrides.resolve_key("training.seed", config.Config) == "training.seed"
    with pytest.raises(HaloError, match="ambiguous"):
        overrides.resolve_key("max_seq_len", config.Config)
    with pytest.raises(HaloError, match="expected --KEY=VALUE"):
        overrides.parse(["lr=3"])


def test_unknown_override_is_reported_with_its_path() -> None:
    with pytest.raises(HaloError, match=r"training.max_stepz: unknown key"):
        config.load(EXAMPLES / "sft" / "config.yaml", "sft", ["--training.max_stepz=3"])
