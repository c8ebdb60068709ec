"""runtime.profile: torch.profiler around the asked steps, a Chrome trace per rank under
$HALO_DATA_ROOT/profiling/<job>/ and the top operators in the log; nothing at all when off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import EXAMPLES, train_here

pytestmark = pytest.mark.cpu

SFT = EXAMPLES / "sft" / "config.yaml"


def test_the_profiled_steps_write_a_trace_holding_the_models_matmuls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HALO_DATA_ROOT", str(tmp_path / "data"))
    rc, out = train_here(
        "sft", SFT, tmp_path, "--training.max_steps=3", "--checkpoint.every_steps=0",
        '--runtime.profile={"start_step": 2, "steps": 1}',
    )  # fmt: skip
    assert rc == 0, out[-2000:]
    folder = tmp_path / "data" / "profiling" / "tiny-sft"
    assert [p.name for p in folder.iterdir()] == ["rank0-steps2-2.json"]
    trace = json.loads((folder / "rank0-steps2-2.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    # The decoder's projections: linear -> matmul/addmm/mm in aten, forward and backward.
    assert names & {"aten::mm", "aten::addmm", "aten::matmul", "aten::linear"}, sorted(names)[:40]
    lines = out.splitlines()
    head = lines.index("profile rank 0, steps 2-2: top operators by self CPU time")
    table = lines[head + 2 : head + 10]
    assert len(table) == 8 and any("aten::" in row for row in table)
    assert f"profile rank 0: trace {folder / 'rank0-steps2-2.json'}" in lines


def test_profiling_is_off_unless_asked_and_only_on_its_ranks(sft_config: Path) -> None:
    from halo.train import config
    from halo.train.observe import profiling

    cfg = config.load(sft_config, "sft")
    assert cfg.runtime.profile is None and profiling.window(cfg, 0, 10) is None
    on = config.load(sft_config, "sft", ['--runtime.profile={"start_step": 3, "ranks": [1]}'])
    assert profiling.window(on, 0, 10) is None
    w = profiling.window(on, 1, 10)
    assert w is not None and (w.first, w.last) == (3, 4)
    assert profiling.window(on, 1, 3).last == 3  # type: ignore[union-attr]  (clipped to the run)
