"""No checkpoint is ever lost or trusted blindly: verification, lineages, pruning, divergence."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from halo.train.checkpoints import checkpoint

from .conftest import EXAMPLES, metrics, outputs, train_here

pytestmark = pytest.mark.cpu

SFT = EXAMPLES / "sft" / "config.yaml"
SHORT = ["--training.max_steps=4", "--checkpoint.every_steps=2", "--checkpoint.keep_last=0"]


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A job folder with r1 step 2 and r1 step 4, written once for the module."""
    tmp = tmp_path_factory.mktemp("two")
    rc, out = train_here("sft", SFT, tmp, *SHORT)
    assert rc == 0, out
    return tmp


def job(tmp: Path) -> Path:
    return tmp / "ck" / "tiny-sft"


def copy_of(src: Path, tmp: Path) -> Path:
    shutil.copytree(src / "ck", tmp / "ck")
    return tmp


def newest(tmp: Path) -> Path:
    return job(tmp) / "r1_epoch_0_step_4"


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (
            lambda p: truncate(p / "model.safetensors"),
            "model.safetensors does not match its sha256",
        ),
        (lambda p: truncate(p / "trainer" / "optimizer.pt"), "trainer/optimizer.pt does not match"),
        (
            lambda p: (p / "meta.json").write_text("[]"),
            "meta.json is missing or not a checkpoint record",
        ),
        (lambda p: (p / "config.json").unlink(), "missing config.json"),
    ],
)
def test_a_damaged_newest_checkpoint_is_skipped_for_the_previous_one(
    two_checkpoints: Path, tmp_path: Path, damage: object, reason: str
) -> None:
    tmp = copy_of(two_checkpoints, tmp_path)
    damage(newest(tmp))  # type: ignore[operator]
    rc, out = train_here("sft", SFT, tmp, *SHORT)
    assert rc == 0, out
    skipped = [line for line in out.splitlines() if "skipping r1_epoch_0_step_4" in line]
    assert len(skipped) == 1 and reason in skipped[0], out
    assert f"resumed from {job(tmp) / 'r1_epoch_0_step_2'} (step 2)" in out
    assert (job(tmp) / ".r1_epoch_0_step_4.bad").is_dir()  # kept for a post-mortem
    assert checkpoint.verify(newest(tmp)) is None  # step 4 written again, whole


def test_non_finite_weights_with_matching_hashes_are_skipped(
    two_checkpoints: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    tmp = copy_of(two_checkpoints, tmp_path)
    path = newest(tmp)
    weights = load_file(str(path / "model.safetensors"))
    weights["model.norm.weight"][0] = float("nan")
    save_file(weights, str(path / "model.safetensors"), {"format": "pt"})
    meta = json.loads((path / "meta.json").read_text())
    meta["files"]["model.safetensors"] = checkpoint.sha256_file(path / "model.safetensors")
    (path / "meta.json").write_text(json.dumps(meta))
    assert checkpoint.verify(path) == "model.safetensors: model.norm.weight holds non-finite values"
    rc, out = train_here("sft", SFT, tmp, *SHORT)
    assert rc == 0, out
    assert (
        "skipping r1_epoch_0_step_4: model.safetensors: model.norm.weight holds non-finite" in out
    )
    assert "(step 2)" in out


@pytest.mark.parametrize("every", [1, 2])
def test_a_non_finite_loss_stops_with_exit_1_before_any_save_or_prune(
    two_checkpoints: Path, tmp_path: Path, every: int
) -> None:
    tmp = copy_of(two_checkpoints, tmp_path)
    before = sorted(p.name for p in job(tmp).iterdir())
    extra = [
        "--training.max_steps=8",
        f"--checkpoint.every_steps={every}",
        "--checkpoint.keep_last=1",
    ]
    # A new lineage (a resumed run keeps its checkpoint's learning rate) that blows up at once.
    # lr 1e30: huge but finite weights after step 1, a non-finite loss or gradient in step 2.
    rc, out = train_here("sft", SFT, tmp, *extra, "--checkpoint.resume=false", "--lr=1e30")
    assert rc == 1, out
    assert "halo: error: step 2: " in out and "stopping before" in out, out
    # every=1: step 1's (finite) checkpoint of the new lineage is written; step 2's never is.
    written = ["r2_epoch_0_step_1"] if every == 1 else []
    after = sorted(p.name for p in job(tmp).iterdir())
    assert after == sorted(before + written)  # the older lineage: nothing pruned


def test_a_checkpoint_of_non_finite_weights_is_never_written(tmp_path: Path) -> None:
    from halo.train import config
    from halo.train.data import tokenizer as tk
    from halo.train.loop import saving, setup
    from halo.train.methods import sft
    from halo.train.parallel import distributed
    from halo.train.state import DivergedError

    cfg = config.load(SFT, "sft", outputs(tmp_path))
    tok = tk.for_config(cfg)
    tr = setup.setup(
        cfg, sft.build(cfg, tok), tok, distributed.Context(0, 1, 0, torch.device("cpu")), 4
    )
    with torch.no_grad():
        tr.model.model.norm.weight[0] = float("inf")
    with pytest.raises(DivergedError, match=r"weight model\.norm\.weight is not finite"):
        saving.save(tr, "periodic", 0)
    assert not cfg.job_dir.exists()


def test_resume_false_starts_a_new_lineage_and_leaves_the_old_one_alone(
    two_checkpoints: Path, tmp_path: Path
) -> None:
    tmp = copy_of(two_checkpoints, tmp_path)
    old = {p.name: checkpoint.sha256_file(p / "model.safetensors") for p in job(tmp).iterdir()}
    extra = ["--training.max_steps=6", "--checkpoint.every_steps=2", "--checkpoint.keep_last=1"]
    rc, out = train_here("sft", SFT, tmp, *extra, "--checkpoint.resume=false")
    assert rc == 0, out
    assert "resumed" not in out
    names = sorted(f.path.name for f in checkpoint.complete(job(tmp)))
    assert names == ["r1_epoch_0_step_2", "r1_epoch_0_step_4", "r2_epoch_0_step_6"]
    for name, digest in old.items():
        assert checkpoint.sha256_file(job(tmp) / name / "model.safetensors") == digest
    assert out.strip().endswith(f"checkpoint {job(tmp) / 'r2_epoch_0_step_6'}")
    assert checkpoint.latest(job(tmp)).path.name == "r2_epoch_0_step_6"  # type: ignore[union-attr]
    # The next resume continues the newest lineage.
    rc, again = train_here("sft", SFT, tmp, "--training.max_steps=7", "--checkpoint.keep_last=1")
    assert rc == 0 and f"resumed from {job(tmp) / 'r2_epoch_0_step_6'}" in again, again


def test_pruning_keeps_other_lineages_and_the_newest(tmp_path: Path) -> None:
    for name in (
        "r1_epoch_0_step_8",
        "r2_epoch_0_step_2",
        "r2_epoch_0_step_4",
        "r2_epoch_0_step_6",
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "meta.json").write_text('{"files": {}}')
    gone = checkpoint.prune(tmp_path, lineage=2, keep_last=1)
    assert [p.name for p in gone] == ["r2_epoch_0_step_2", "r2_epoch_0_step_4"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r1_epoch_0_step_8", "r2_epoch_0_step_6"]
    assert checkpoint.prune(tmp_path, lineage=3, keep_last=1) == []
    assert checkpoint.next_lineage(tmp_path) == 3


@pytest.mark.parametrize("size", ["512", "128"])  # larger and smaller
def test_a_changed_architecture_is_one_line_and_exit_2(
    two_checkpoints: Path, tmp_path: Path, size: str
) -> None:
    tmp = copy_of(two_checkpoints, tmp_path)
    rc, out = train_here("sft", SFT, tmp, *SHORT, f"--model.config.intermediate_size={size}")
    assert rc == 2, out
    (line,) = [x for x in out.splitlines() if x.startswith("halo: error:")]
    assert f"intermediate_size 256 -> {size}" in line
    assert (
        "the model differs from this config" in line
        and "resuming needs the same architecture" in line
    )
    assert "Traceback" not in out


def test_checkpoints_record_every_file_and_metrics_hold_every_step(two_checkpoints: Path) -> None:
    path = newest(two_checkpoints)
    meta = json.loads((path / "meta.json").read_text())
    on_disk = sorted(
        str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p.name != "meta.json"
    )
    assert sorted(meta["files"]) == on_disk
    assert meta["lineage"] == 1 and meta["step"] == 4
    assert [r["step"] for r in metrics(two_checkpoints, "tiny-sft")] == [1, 2, 3, 4]
    state = checkpoint.load_trainer_state(path)
    assert set(state) == {"optimizer", "scheduler", "rng"} and isinstance(
        state["rng"]["torch"], torch.Tensor
    )


def test_halo_export_writes_a_serving_folder_and_refuses_a_damaged_checkpoint(
    two_checkpoints: Path, tmp_path: Path
) -> None:
    from .conftest import run_halo

    out = tmp_path / "served"
    ok = run_halo("export", str(newest(two_checkpoints)), str(out))
    assert ok.returncode == 0, ok.stderr
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert not (out / "meta.json").exists() and not (out / "trainer").exists()
    damaged = copy_of(two_checkpoints, tmp_path / "d")
    truncate(newest(damaged) / "model.safetensors")
    bad = run_halo("export", str(newest(damaged)), str(tmp_path / "served2"))
    assert bad.returncode == 2 and "does not match its sha256" in bad.stderr
    assert bad.stderr.count("\n") == 1 and not (tmp_path / "served2").exists()


def test_a_pretrained_model_loads_from_a_folder_and_from_the_hub_cache(
    two_checkpoints: Path, tmp_path: Path
) -> None:
    from halo.train.checkpoints import export
    from halo.train.models import hfcache

    from .conftest import run_halo

    served = export.export(newest(two_checkpoints), tmp_path / "served")
    listing = tmp_path / "list.toml"
    files = "".join(f'"{k}" = "{v}"\n' for k, v in hfcache.files_of(served).items())
    listing.write_text(
        f'[[model]]\nid = "halo-test/tiny-sft"\nrevision = "{"a" * 40}"\n'
        f'local = "{served}"\n[model.files]\n{files}'
    )
    cache = tmp_path / "hub"
    seeded = run_halo("hf-cache", "seed", str(listing), "--cache", str(cache))
    assert seeded.returncode == 0 and "files verified" in seeded.stdout, seeded.stderr
    for source in (str(served), "halo-test/tiny-sft"):
        r = run_halo(
            "launch", "sft", str(SFT), "--", *outputs(tmp_path / source.replace("/", "_")),
            f"--model.name_or_path={source}", "--model.config=null", "--model.tokenizer=null",
            "--training.max_steps=1", HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1",
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        # Starts where the checkpoint ended: the loss is well below a fresh model's (~6).
        first = re.search(r"step 1/\d+ epoch \d+ loss ([0-9.]+)", r.stdout)
        assert first and float(first[1]) < 5.0, r.stdout
