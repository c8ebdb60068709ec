"""`halo launch --list` names every method with what it trains, its data and what it needs,
with no torch; and the new methods' --dry-run views, also with no torch (a login node)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import EXAMPLES, REPO, TOKENIZER, halo_env

pytestmark = pytest.mark.cpu

METHODS = [
    "classification", "embedding", "environmental-grpo", "offline-grpo", "online-grpo",
    "preference/dpo", "preference/simpo", "preference/smpo", "sft",
]  # fmt: skip


def without_torch(*argvs: list[str]) -> subprocess.CompletedProcess[str]:
    """Each `halo ARGV` in turn, in one interpreter where torch cannot be imported."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "from halo.cli import main\n"
        f"for argv in {[list(a) for a in argvs]!r}:\n"
        "    print('=== ' + argv[0], flush=True)\n"
        "    assert main(argv) == 0, argv\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], env=halo_env(), capture_output=True, text=True,
        timeout=600, cwd=REPO,
    )  # fmt: skip


def columns(listing: str) -> dict[str, dict[str, str]]:
    """The --list table by method, then by column header (columns cut where the rule's are)."""
    lines = [line for line in listing.splitlines() if line.strip()]
    at = next(i for i, line in enumerate(lines) if line.startswith("---"))
    spans, pos = [], 0
    for dashes in lines[at].split("  "):
        spans.append((pos, pos + len(dashes)))
        pos += len(dashes) + 2
    cut = [[line[a:b].strip() for a, b in spans] for line in lines[at - 1 :] if line]
    header, rows = cut[0], cut[2:]
    return {row[0]: dict(zip(header, row, strict=True)) for row in rows}


def dry_run(method: str, example: str, tmp: Path, *extra: str) -> list[str]:
    return [
        "launch", method, str(EXAMPLES / example / "config.yaml"), "--dry-run", "--",
        f"--runtime.paths.checkpoints={tmp / 'ck'}", f"--runtime.paths.logs={tmp / 'logs'}",
        *extra,
    ]  # fmt: skip


def test_the_list_and_the_new_methods_views_need_no_torch(tmp_path: Path) -> None:
    r = without_torch(
        ["launch", "--list"],
        dry_run("classification", "classification", tmp_path),
        dry_run("embedding", "embedding", tmp_path),
        dry_run("preference/simpo", "simpo", tmp_path),
        dry_run("preference/smpo", "smpo", tmp_path),
        dry_run("environmental-grpo", "environmental-grpo", tmp_path,
                f"--model.tokenizer={TOKENIZER}"),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert "(not shown: the loss-mask view" not in r.stdout, r.stdout
    assert not tmp_path.joinpath("ck").exists()  # dry runs write nothing
    table = columns(r.stdout.split("=== launch")[1].split("===")[0])
    assert sorted(table) == METHODS
    assert table["classification"]["data"] == "text + label"
    assert table["embedding"]["data"] == "query + positive [+ negatives]"
    assert table["preference/smpo"]["data"] == table["preference/dpo"]["data"]
    for name in METHODS:
        needs = (table[name]["reference model"], table[name]["rollout server"])
        if name == "preference/dpo":
            assert needs == ("yes", "no")
        elif name.endswith("grpo"):
            assert needs[0] == "if grpo.kl_coef > 0"
            assert (needs[1] != "no") == (name != "offline-grpo"), name
        else:
            assert needs == ("no", "no"), name
        assert table[name]["what it trains"], name
    out = r.stdout
    assert (
        "classification: train.jsonl example 1 (pooled at its last token, '?'): "
        "'What is 6 - 5?' -> 'subtraction'" in out
    ), out
    assert (
        "embedding: train.jsonl example 1 (mean pooling): query 'What is 4 + 7?<|im_end|>'" in out
    )
    assert "preference: chosen of train.jsonl example 1" in out
    assert (
        "environmental-grpo: train.jsonl row 1, the episode's prompt: "
        "'<|im_start|>user\\nWhat is 30 + 67?<|im_end|>\\n<|im_start|>assistant\\n'" in out
    ), out
