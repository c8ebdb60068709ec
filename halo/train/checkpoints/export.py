"""Hugging Face model folders: what transformers, vLLM and SGLang load.

``write_hf`` writes safetensors shards (with their index when there is more than one),
config.json, generation_config.json and the tokenizer with its chat template into a folder.
Checkpoints use it for their model part; ``halo export CHECKPOINT OUT`` copies that part of a
verified checkpoint into a serving folder; online GRPO calls ``write_hf`` after an update.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from halo.atomic import staged_dir
from halo.errors import HaloError

if TYPE_CHECKING:
    import torch

INDEX = "model.safetensors.index.json"
# What a serving folder holds from a checkpoint (the rest is trainer state).
TRAINER_STATE = ("meta.json", "trainer")
SHARD_BYTES = 2 * 1024**3


def shards(state: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Tensors in key order, cut into groups of at most ``max_bytes`` (one tensor at least)."""
    out: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key in sorted(state):
        t = state[key]
        n = t.numel() * t.element_size()
        if out[-1] and size + n > max_bytes:
            out.append({})
            size = 0
        out[-1][key] = t
        size += n
    return out


def write_weights(folder: Path, state: dict[str, torch.Tensor], max_bytes: int) -> None:
    from safetensors.torch import save_file

    groups = shards(state, max_bytes)
    if len(groups) == 1:
        save_file(_contiguous(groups[0]), str(folder / "model.safetensors"), {"format": "pt"})
        return
    weight_map, total = {}, 0
    for i, group in enumerate(groups, 1):
        name = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        save_file(_contiguous(group), str(folder / name), {"format": "pt"})
        for key, t in group.items():
            weight_map[key] = name
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def _contiguous(group: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous() for k, v in group.items()}


def write_hf(
    folder: Path,
    state: dict[str, torch.Tensor],
    config: Any,
    tokenizer: Any,
    max_shard_bytes: int = SHARD_BYTES,
) -> None:
    """A loadable model folder in ``folder`` (which exists and is empty)."""
    if getattr(config, "tie_word_embeddings", False):
        # Tied: the head is the embedding; loaders re-tie it, so it is stored once.
        state = {k: v for k, v in state.items() if not k.endswith("lm_head.weight")}
    write_weights(folder, state, max_shard_bytes)
    write_hf_files(folder, config, tokenizer)


def write_hf_files(folder: Path, config: Any, tokenizer: Any) -> None:
    """A model folder's files beside its weights: config.json, generation_config.json and the
    tokenizer (sharded checkpoints write these, their weights in shards of their own)."""
    from transformers import GenerationConfig

    config.save_pretrained(str(folder))
    gen = GenerationConfig.from_model_config(config)
    gen.eos_token_id = tokenizer.eos_id
    gen.pad_token_id = tokenizer.pad_id
    gen.save_pretrained(str(folder))
    tokenizer.save(folder)


def model_files(checkpoint: Path) -> list[str]:
    """The serving part of a checkpoint: the files its record lists, but the trainer's state."""
    from halo.train.checkpoints import checkpoint as ck

    return [r for r in ck.listed(checkpoint) if r.split("/")[0] not in TRAINER_STATE]


def _copy_regular(src: Path, dest: Path, digest: str) -> None:
    """Copy one file as a regular file, never through a link (O_NOFOLLOW), and check that
    what was copied is what the record verified (it may change after the check)."""
    import hashlib
    import os
    import stat

    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HaloError(f"{src}: not a regular file; not exported")
        h = hashlib.sha256()
        dest.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.dup(fd), "rb") as fin, dest.open("xb") as fout:
            while chunk := fin.read(1 << 20):
                h.update(chunk)
                fout.write(chunk)
    finally:
        os.close(fd)
    if h.hexdigest() != digest:
        raise HaloError(f"{src}: changed while it was exported; not exported")
    dest.chmod(0o644)


def export(checkpoint: Path, out: Path) -> Path:
    """Copy a verified checkpoint's listed model files to ``out`` (complete or absent)."""
    from halo.train.checkpoints import checkpoint as ck

    if not (checkpoint / "meta.json").is_file():
        raise HaloError(f"{checkpoint}: not a checkpoint (no meta.json)")
    problem = ck.verify(checkpoint)
    if problem:
        raise HaloError(f"{checkpoint}: {problem}")
    if out.exists() and any(out.iterdir()):
        raise HaloError(f"{out}: exists and is not empty")
    if out.exists():
        out.rmdir()
    meta = ck.read_meta(checkpoint) or {}
    files = meta.get("files", {})
    sharded = meta.get("format") == "dcp"
    with staged_dir(out) as tmp:
        for rel in model_files(checkpoint):
            if sharded and rel.split("/")[0] == "dcp":
                continue  # the shards: consolidated below
            entry = files[rel]
            digest = entry if isinstance(entry, str) else entry["sha256"]
            _copy_regular(checkpoint / rel, tmp / rel, digest)
        if sharded:
            _consolidate(checkpoint, tmp)
        tmp.chmod(0o755)
    return out


def _consolidate(checkpoint: Path, folder: Path) -> None:
    """A sharded (DCP) checkpoint's weights, whole, as the safetensors write_hf writes."""
    from transformers import AutoConfig

    from halo.train.parallel import dcp

    state = dcp.consolidate(checkpoint)
    conf = AutoConfig.from_pretrained(str(checkpoint), local_files_only=True)
    if getattr(conf, "tie_word_embeddings", False):
        state = {k: v for k, v in state.items() if not k.endswith("lm_head.weight")}
    write_weights(folder, state, SHARD_BYTES)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a checkpoint's model as a Hugging Face serving folder",
        description="Copy the Hugging Face model files of CHECKPOINT (verified against its "
        "meta.json) into OUT: what transformers, vLLM and SGLang load.",
    )
    p.add_argument("checkpoint", type=Path)
    p.add_argument("out", type=Path)
    p.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    out = export(args.checkpoint, args.out)
    print(f"exported {args.checkpoint} -> {out}")
    return 0
