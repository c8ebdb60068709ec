"""`halo plot RUN_DIR [RUN_DIR2]`: one PNG of a run's curves from its metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

PNG = b"\x89PNG\r\n\x1a\n"


def _run(folder: Path, rows: list[dict[str, float]]) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _sft_rows(scale: float) -> list[dict[str, float]]:
    rows: list[dict[str, float]] = [
        {"step": s, "loss": scale / s, "lr": 1e-3, "grad_norm": 2.0 / s, "tokens_per_s": 900.0 + s}
        for s in range(1, 6)
    ]
    return [*rows, {"step": 5, "eval_loss": scale / 4}]


def test_one_run_and_two_runs_compared_become_pngs(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib", reason="the trainer's stack carries matplotlib")
    from matplotlib.image import imread

    from halo.cli import main
    from halo.train.observe import plot

    a = _run(tmp_path / "a" / "tiny-sft", _sft_rows(3.0))
    b = _run(tmp_path / "b" / "tiny-sft", _sft_rows(2.0))
    assert main(["plot", str(a)]) == 0
    assert capsys.readouterr().out == f"{a / 'metrics.png'}\n"
    one = (a / "metrics.png").read_bytes()
    assert one.startswith(PNG) and imread(a / "metrics.png").shape[2] in (3, 4)
    assert main(["plot", str(a / "metrics.jsonl"), str(b), "-o", str(tmp_path / "ab.png")]) == 0
    assert (tmp_path / "ab.png").read_bytes().startswith(PNG)
    assert plot._labels([a, b]) == ["a/tiny-sft", "b/tiny-sft"]
    # The same metrics draw the same bytes (no date or software version in the file).
    assert main(["plot", str(a)]) == 0
    assert (a / "metrics.png").read_bytes() == one


def test_reward_and_accuracy_get_their_panels_when_recorded() -> None:
    from halo.train.observe import plot

    sft = {"loss": {1: 1.0}, "lr": {1: 1e-3}}
    grpo = {**sft, "reward": {1: 0.5}, "eval_reward": {0: 0.2}}
    cls = {**sft, "eval_accuracy": {1: 0.9}}
    core = ["loss", "learning rate", "gradient norm", "throughput (tokens/s)"]
    assert plot.panels([sft]) == core
    assert plot.panels([grpo]) == [*core, "reward"]
    assert plot.panels([sft, cls]) == [*core, "accuracy"]


def test_a_run_without_metrics_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from halo.cli import main

    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"halo: error: {tmp_path}: no metrics.jsonl (give a run's log folder, <logs>/<job>)\n"
    )
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\nnot json\n')
    assert main(["plot", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(
        f"halo: error: {tmp_path / 'metrics.jsonl'}:2: not valid JSON"
    )
    assert not (tmp_path / "metrics.png").exists()
