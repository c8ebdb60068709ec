"""A login node: halo and the tokenizer libraries, no torch. `halo launch --dry-run` shows each
method's loss-mask view there exactly as a training node does, and when a tokenizer library is
missing too, says which in one line and prints everything else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .conftest import EXAMPLES, TOKENIZER, outputs, run_halo_without

pytestmark = pytest.mark.cpu

VIEW = "# first example of each data source\n"
# (method, example, overrides): online-grpo's model is the served output of its first step
# (examples/online-grpo/config.yaml), so its view reads the examples' tokenizer instead.
CASES = [
    ("sft", "sft", []),
    ("sft", "sft-mix", []),
    ("preference/dpo", "dpo", []),
    ("offline-grpo", "grpo", []),
    ("online-grpo", "online-grpo", [f"--model.tokenizer={TOKENIZER}"]),
]


def argv(method: str, example: str, tmp: Path, *extra: str) -> list[str]:
    config = str(EXAMPLES / example / "config.yaml")
    return ["launch", method, config, "--dry-run", "--", *outputs(tmp), *extra]


def dry_run(blocked: list[str], method: str, example: str, tmp: Path, *extra: str) -> str:
    r = run_halo_without(blocked, *argv(method, example, tmp, *extra))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert list(tmp.iterdir()) == []  # a dry run writes nothing
    return r.stdout


def view(stdout: str) -> list[str]:
    assert VIEW in stdout, stdout
    return stdout.split(VIEW, 1)[1].splitlines()


def first_record(example: str) -> dict[str, Any]:
    path = EXAMPLES / example / "train.jsonl"
    return dict(json.loads(path.read_text().splitlines()[0]))


def shown(method: str, row: dict[str, Any]) -> tuple[str, str]:
    """(the prompt, not trained on; the answer as trained on) of a first record, as the view
    writes them (repr: a newline is a backslash and an n)."""
    if method == "sft":
        *_, user, answer = row["messages"]
        return user["content"], f"[[{answer['content']}<|im_end|>]]"
    if method == "preference/dpo":
        return row["prompt"], f"[[{row['chosen']}<|im_end|>]]"
    if method == "offline-grpo":
        return row["prompt"], f"[[{row['completions'][0]['text']}<|im_end|>]]"
    # online-grpo: no mask, the prompt as the rollout server is sent it, ready to generate
    return row["prompt"], "<|im_end|>\\n<|im_start|>assistant\\n'"


@pytest.mark.parametrize(("method", "example", "extra"), CASES, ids=[c[1] for c in CASES])
def test_the_loss_mask_view_needs_no_torch(
    method: str, example: str, extra: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    without = view(dry_run(["torch"], method, example, tmp_path, *extra))
    # The same dry run in this process, where torch can be imported: the same view.
    from halo.cli import main

    assert main(argv(method, example, tmp_path, *extra)) == 0
    assert view(capsys.readouterr().out) == without
    assert without and all("not shown" not in line for line in without), without
    if example == "sft-mix":  # three sources, one a Parquet file: a view each
        assert len(without) == 3 and all("[[" in line for line in without), without
        return
    prompt, answer = shown(method, first_record(example))
    (line,) = without
    rendered = line[line.index("'") :]  # after the line's own "(trained-on text in [[...]])"
    assert answer in rendered, line
    if method == "online-grpo":
        assert prompt in rendered and "[[" not in rendered, line
    else:  # one trained-on span, the answer; the prompt before it is context
        assert rendered.count("[[") == 1 and rendered.index(prompt) < rendered.index("[["), line


@pytest.mark.parametrize("missing", ["transformers", "tokenizers", "jinja2"])
def test_a_missing_tokenizer_library_is_one_line(missing: str, tmp_path: Path) -> None:
    out = dry_run(["torch", missing], "sft", "sft", tmp_path)
    assert view(out) == [
        f"(not shown: the loss-mask view needs the Python package '{missing}' here)"
    ]
    for part in ("# launcher: ", "command: ", "# preflight", "# resolved config"):
        assert part in out, out
