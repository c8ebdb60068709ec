"""Sharded checkpoints with torch.distributed.checkpoint (DCP), under any mesh.

A DCP checkpoint keeps every guarantee of halo.train.checkpoints.checkpoint: it is written once into a
hidden temp folder and renamed into place, and its meta.json, written last, records the
sha256 and size of every file. Rank 0 makes the folder and tells the others its name; every
rank writes its own shards of the model and the optimizer into ``dcp/`` (no rank gathers the
whole model); rank 0 adds config.json, the tokenizer and the trainer state, then the record.

The shards are keyed by the model's parameter names (transformers' own: halo's MoE blocks keep
them), not by the mesh, so a run resumes on another mesh (ep 2 -> 1, tp 2 -> 1, FSDP 4 -> 2)
and DCP cuts what it reads to the new shards. ``consolidate`` reads them back whole, with no
process group, for `halo export` (Hugging Face safetensors).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from halo.errors import HaloError
from halo.train.checkpoints import checkpoint
from halo.train.state import Trainer

FOLDER = "dcp"
MODEL = "model"
OPTIMIZER = "optimizer"


def enabled(tr: Trainer) -> bool:
    """checkpoint.format dcp; or auto under a mesh that splits the model over processes."""
    fmt = tr.cfg.checkpoint.format
    if fmt != "auto":
        return fmt == "dcp"
    mesh = tr.ctx.mesh
    return mesh is not None and mesh.distributed and mesh.dims.model_parallel


def is_dcp(meta: dict[str, Any]) -> bool:
    return meta.get("format") == "dcp"


def _states(tr: Trainer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    return {
        MODEL: get_model_state_dict(tr.model),
        OPTIMIZER: get_optimizer_state_dict(tr.model, tr.optim),
    }


def _local(t: Any) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def nonfinite(model_state: dict[str, Any]) -> str | None:
    """The first weight of this rank's shards holding inf or nan."""
    for key, t in model_state.items():
        local = _local(t)
        floating = isinstance(local, torch.Tensor) and local.is_floating_point()
        if floating and not bool(torch.isfinite(local).all()):
            return key
    return None


def write_shards(tr: Trainer, states: dict[str, Any], folder: Path) -> None:
    """Every rank's shards into ``folder`` (collective)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(states, checkpoint_id=str(folder))


def save(
    tr: Trainer,
    dirname: str,
    trainer_state: dict[str, Any],
    meta: dict[str, Any],
    write_hf_files: Any,
    hook_sleep: float,
) -> Path | None:
    """Write checkpoint ``dirname`` (collective). Returns its path on rank 0."""
    ctx, cfg = tr.ctx, tr.cfg
    states = _states(tr)
    bad = nonfinite(states[MODEL])
    if ctx.any(bad is not None):
        from halo.train.state import DivergedError

        raise DivergedError(
            f"step {tr.step}: a weight ({bad or 'on another rank'}) is not finite; no checkpoint written"
        )
    if not ctx.is_main:
        tmp = ctx.broadcast(None)
        if tmp is not None:
            write_shards(tr, states, Path(tmp) / FOLDER)
        ctx.barrier()
        return None

    told = False

    def write_model(folder: Path) -> None:
        nonlocal told
        ctx.broadcast(str(folder))
        told = True
        write_shards(tr, states, folder / FOLDER)
        ctx.barrier()  # every rank's shards are on disk before the record lists them
        write_hf_files(folder)

    mesh = ctx.mesh.dims.sizes() if ctx.mesh is not None else {}
    record = {**meta, "format": "dcp", "mesh": mesh}
    try:
        return checkpoint.write(
            cfg.job_dir, dirname, write_model, trainer_state, record, hook_sleep
        )
    except BaseException:
        if not told:
            ctx.broadcast(None)  # the others wait for a folder that never came: release them
        raise


def load(tr: Trainer, path: Path) -> None:
    """The model and optimizer shards of ``path`` into this run's mesh (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    states = _states(tr)
    with warnings.catch_warnings():  # one process: no process group, as meant
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(states, checkpoint_id=str(path / FOLDER))
    set_model_state_dict(tr.model, states[MODEL])
    set_optimizer_state_dict(tr.model, tr.optim, states[OPTIMIZER])


def consolidate(path: Path) -> dict[str, torch.Tensor]:
    """The whole model of a DCP checkpoint folder, keyed by parameter name (no process group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(str(path / FOLDER))
    try:
        meta = reader.read_metadata()
    except Exception as exc:  # a damaged .metadata (the record's hashes passed): one line
        raise HaloError(f"{path / FOLDER}: not a readable DCP checkpoint ({exc})") from None
    prefix = f"{MODEL}."
    want = {
        key: torch.empty(m.size, dtype=m.properties.dtype)
        for key, m in meta.state_dict_metadata.items()
        if key.startswith(prefix) and isinstance(m, TensorStorageMetadata)
    }
    if not want:
        raise HaloError(f"{path / FOLDER}: holds no model weights")
    with warnings.catch_warnings():  # "no process group: loading in one process", as meant
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(want, storage_reader=reader, no_dist=True)
    return {key[len(prefix) :]: t for key, t in want.items()}
