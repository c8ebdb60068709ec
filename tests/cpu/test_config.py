"""Config validation: every problem at once, with its key path; overrides; path resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from halo.errors import HaloError
from halo.train import config, overrides

from .conftest import EXAMPLES, outputs, run_halo

pytestmark = pytest.mark.cpu

BROKEN = """
runtime:
  job_name: broken
  paths: {checkpoints: out/ck, logs: out/logs}
  parallel_mode: sideways
model:
  config: {model_type: llama, hidden_size: 64}
  tokenizer: tok
  attention: "sixty-four"
data:
  train: missing.jsonl
optim:
  lr: fast
  colour: blue
training:
  global_batch_size: 8
surprise: 1
"""


def write(tmp: Path, text: str | bytes) -> Path:
    p = tmp / "cfg.yaml"
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def load_error(tmp: Path, text: str | bytes, *extra: str, method: str = "sft") -> str:
    with pytest.raises(HaloError) as err:
        config.load(write(tmp, text), method, list(extra))
    return err.value.message


def test_broken_config_lists_every_problem_with_key_paths(tmp_path: Path) -> None:
    msg = load_error(tmp_path, BROKEN)
    for expected in (
        "runtime.parallel_mode: Input should be 'auto', 'none', 'ddp' or 'fsdp', got 'sideways'",
        "model.attention: Input should be 'auto', 'sdpa', 'fa2', 'fa3' or 'fa4'",
        "optim.lr: Input should be a valid number",
        "optim.colour: unknown key",
        "surprise: unknown key",
    ):
        assert expected in msg, msg
    assert "6 problems" not in msg and "5 problems" in msg
    assert "\n" not in msg  # one line


def test_missing_files_are_reported_once_the_types_are_right(tmp_path: Path) -> None:
    text = BROKEN.replace("parallel_mode: sideways", "parallel_mode: auto")
    text = text.replace('attention: "sixty-four"', "attention: auto").replace("lr: fast", "lr: 1")
    text = text.replace("  colour: blue\n", "").replace("surprise: 1\n", "")
    msg = load_error(tmp_path, text)
    assert f"data.train: file not found: {tmp_path / 'missing.jsonl'}" in msg


def test_broken_config_cli_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    cfg = write(tmp_path, BROKEN)
    before = sorted(tmp_path.rglob("*"))
    for args in (("launch", "sft", str(cfg)), ("preflight", str(cfg))):
        r = run_halo(*args)
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith("halo: error: "), r.stderr
        assert "optim.lr: Input should be a valid number" in r.stderr
        assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("runtime: {job_name: a}\nruntime: {job_name: b}\n", "duplicate key 'runtime'"),
        ("runtime: {job_name: a, job_name: b}\n", "duplicate key 'job_name'"),
        (b"runtime: {job_name: \xff}\n", "not UTF-8 text (byte 0xff at offset 20, line 1)"),
    ],
)
def test_yaml_that_is_not_plainly_one_mapping_is_refused(
    tmp_path: Path, text: str | bytes, expected: str
) -> None:
    assert expected in load_error(tmp_path, text)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("--lr=.inf", "optim.lr: Input should be a finite number"),
        ("--lr=.nan", "optim.lr: Input should be a finite number"),
        ("--lr=-1", "optim.lr: Input should be greater than 0"),
        (
            "--training.global_batch_size=0",
            "training.global_batch_size: Input should be greater than 0",
        ),
        ("--optim.betas=[0.9, 1.5]", "optim.betas[1]: Input should be less than 1"),
        ("--grpo.clip_eps=0", "grpo.clip_eps: Input should be greater than 0"),
        ("--data.eval_fraction=1", "data.eval_fraction: Input should be less than 1"),
        ("--runtime.job_name=a/b", "runtime.job_name: String should match pattern"),
        ("--model.name_or_path=x", "model: Value error, set exactly one of name_or_path"),
    ],
)
def test_out_of_range_and_non_finite_values_are_refused(override: str, expected: str) -> None:
    with pytest.raises(HaloError) as err:
        config.load(EXAMPLES / "sft" / "config.yaml", "sft", [override])
    assert expected in err.value.message


def test_non_utf8_dataset_line_is_one_error(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_bytes(b'{"messages": [{"role": "user", "content": "\xfe"}]}\n')
    cfg = str(EXAMPLES / "sft" / "config.yaml")
    r = run_halo("launch", "sft", cfg, "--", f"--data.train={data}", *outputs(tmp_path))
    assert r.returncode == 2
    assert f"halo: error: {data}: not UTF-8 text (byte 0xfe" in r.stderr
    assert "Traceback" not in r.stderr


def test_interleave_needs_probabilities_that_add_up(tmp_path: Path) -> None:
    a = EXAMPLES / "sft" / "train.jsonl"
    text = (
        f"runtime: {{job_name: j}}\nmodel: {{name_or_path: {EXAMPLES}}}\n"
        f"data:\n  mix: interleave\n  train:\n    - {{path: {a}, probability: 0.5}}\n"
        f"    - {{path: {a}, probability: 0.4}}\n"
    )
    assert "data.train: probabilities add up to 0.9, expected 1" in load_error(tmp_path, text)


def test_method_sections_belong_to_their_method() -> None:
    sft = EXAMPLES / "sft" / "config.yaml"
    with pytest.raises(
        HaloError,
        match="grpo: section is for method offline-grpo or online-grpo or environmental-grpo, not sft",
    ):
        config.load(sft, "sft", ["--grpo.clip_eps=0.1"])
    assert config.load(sft, "offline-grpo", ["--grpo.clip_eps=0.1"]).grpo.clip_eps == 0.1  # type: ignore[union-attr]


def test_paths_are_relative_to_the_yaml_and_overrides_apply() -> None:
    cfg = config.load(
        EXAMPLES / "sft" / "config.yaml", "sft", ["--lr=1e-5", "--training.max_steps=3"]
    )
    assert cfg.data.sources()[0].path == EXAMPLES / "sft" / "train.jsonl"
    assert cfg.model.tokenizer == str(EXAMPLES / "tokenizer")
    assert cfg.runtime.paths.checkpoints == (EXAMPLES / "sft" / "../../runs/checkpoints").resolve()
    assert cfg.optim.lr == 1e-5 and isinstance(cfg.optim.lr, float)
    assert cfg.training.max_steps == 3
    # A Hub id stays a Hub id (no folder of that name next to the YAML).
    hub = config.load(EXAMPLES / "sft" / "config.yaml", "sft", ["--model.tokenizer=org/name"])
    assert hub.model.tokenizer == "org/name"


def test_yaml_exponent_floats_are_floats() -> None:
    assert config.parse_yaml("lr: 1e-5", "x") == {"lr": 1e-5}


def test_override_keys() -> None:
    assert overrides.resolve_key("lr", config.Config) == "optim.lr"
    assert overrides.resolve_key("training.seed", config.Config) == "training.seed"
    with pytest.raises(HaloError, match="ambiguous"):
        overrides.resolve_key("every_steps", config.Config)
    with pytest.raises(HaloError, match="expected --KEY=VALUE"):
        overrides.parse(["lr=3"])


def test_unknown_override_is_reported_with_its_path() -> None:
    with pytest.raises(HaloError, match=r"training.max_stepz: unknown key"):
        config.load(EXAMPLES / "sft" / "config.yaml", "sft", ["--training.max_stepz=3"])
