"""Checks before any training starts: paths, writability, base model, devices, free disk
(and a warning when the scratch volume is smaller than the checkpoints).

Each check is data in, a row out; `run()` gathers them and fails with every problem at once.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from halo.errors import HaloError
from halo.report import human_bytes
from halo.scratch import scratch_choice
from halo.train.config import Config


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    warn: bool = False  # passes, but `failures` says it on stderr (the detail says why)


def _existing_ancestor(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.exists():
            return p
    return Path("/")


def writable(key: str, path: Path) -> Check:
    """Writable without creating anything: the path, or the nearest existing parent."""
    base = _existing_ancestor(path)
    if not base.is_dir():
        return Check(key, False, f"{base} exists and is not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        return Check(key, False, f"{path}: not writable ({base} is read-only for this user)")
    return Check(key, True, f"{path} (writable)")


# The longest name a run writes inside its job folder: a checkpoint's staging folder
# (".r<L>_epoch_<E>_step_<S>.<random>.tmp"), with room for large numbers.
LONGEST_ENTRY = len(".r9999_epoch_99999_step_9999999999.abcdefgh.tmp.bad")


def folder(key: str, path: Path) -> Check:
    """``path`` is a folder or can be made one: nothing on the way to it is a file, and the
    nearest existing part is writable."""
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                return Check(key, False, f"{p} exists and is not a directory")
            break
    return writable(key, path)


def name_length(key: str, path: Path, name: str) -> Check:
    """``name`` fits the file system's NAME_MAX, and ``path`` plus what the run writes inside
    it fits PATH_MAX (a too-long name otherwise fails at the first checkpoint)."""
    base = _existing_ancestor(path)
    try:
        name_max = os.pathconf(base, "PC_NAME_MAX")
        path_max = os.pathconf(base, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    size = len(os.fsencode(name))
    if size > name_max:
        return Check(key, False, f"{name[:40]}...: {size} bytes, the file system allows {name_max}")
    longest = len(os.fsencode(str(path.absolute()))) + 1 + LONGEST_ENTRY + len("/trainer/x.pt")
    if longest >= path_max:
        return Check(
            key,
            False,
            f"{path}: paths inside it would be {longest} bytes, over PATH_MAX {path_max}",
        )
    return Check(key, True, f"{size} bytes (at most {name_max})")


def outputs(cfg: Config) -> list[Check]:
    """What the run will write: its job's checkpoint and log folders, their names, the disk."""
    return [
        folder("runtime.paths.checkpoints", cfg.job_dir),
        folder("runtime.paths.logs", cfg.log_dir),
        name_length("runtime.job_name", cfg.job_dir, cfg.runtime.job_name),
        disk(cfg, checkpoint_bytes(cfg, n_params(cfg))),
    ]


def _cached(repo: str, name: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        got = try_to_load_from_cache(repo, name)
    except ValueError:  # not a valid Hub id
        return None
    return Path(got) if isinstance(got, str) else None


def _locate(source: str, name: str) -> Path | None:
    """``name`` in a local folder, or in the Hugging Face cache for a Hub id."""
    local = Path(source)
    if local.is_dir():
        return local / name if (local / name).is_file() else None
    return _cached(source, name)


def base_model(cfg: Config) -> Check:
    m = cfg.model
    if m.name_or_path is None:
        kind = (m.config or {}).get("model_type")
        return Check(
            "model", True, f"a fresh {kind} model from model.config (seed {cfg.training.seed})"
        )
    src = m.name_or_path
    if _locate(src, "config.json") is None:
        where = "folder" if Path(src).is_dir() else "Hugging Face cache (halo hf-cache seed)"
        return Check("model.name_or_path", False, f"{src}: no config.json in the {where}")
    weights = [n for n in ("model.safetensors", "model.safetensors.index.json") if _locate(src, n)]
    if not weights:
        return Check("model.name_or_path", False, f"{src}: no model.safetensors (or its index)")
    return Check("model.name_or_path", True, f"{src} (config.json, {weights[0]})")


def tokenizer(cfg: Config) -> Check:
    src = cfg.model.tokenizer or cfg.model.name_or_path or ""
    key = "model.tokenizer" if cfg.model.tokenizer else "model.name_or_path"
    if _locate(src, "tokenizer_config.json") is None and _locate(src, "tokenizer.json") is None:
        return Check(key, False, f"{src}: no tokenizer.json / tokenizer_config.json")
    return Check(key, True, f"{src} (tokenizer)")


def _arch(cfg: Config) -> dict[str, object]:
    if cfg.model.config is not None:
        return dict(cfg.model.config)
    found = _locate(cfg.model.name_or_path or "", "config.json")
    try:
        return dict(json.loads(found.read_text())) if found else {}
    except (OSError, ValueError):
        return {}


def devices(cfg: Config, gpu_count: int, nproc: int) -> Check:
    req = cfg.runtime.devices
    if req == "all":
        if gpu_count == 0:
            return Check("runtime.devices", True, "all: no GPU here, training on the CPU")
        if nproc > gpu_count:
            return Check("runtime.devices", False, f"--nproc {nproc} exceeds the {gpu_count} GPUs")
        return Check("runtime.devices", True, f"all: {gpu_count} GPU(s)")
    bad = [d for d in req if d >= gpu_count or d < 0]
    if bad:
        return Check("runtime.devices", False, f"GPUs {bad} requested, {gpu_count} present")
    if nproc > len(req):
        return Check(
            "runtime.devices", False, f"--nproc {nproc} exceeds the {len(req)} GPUs listed"
        )
    return Check("runtime.devices", True, f"GPUs {req}")


# fp32 weights + AdamW's two moments.
BYTES_PER_PARAM = 4 * 3


def checkpoint_bytes(cfg: Config, n_params: int) -> int:
    # Per kept checkpoint, plus one being written.
    per = n_params * BYTES_PER_PARAM
    keep = cfg.checkpoint.keep_last or 10
    return per * (keep + 1)


def disk(cfg: Config, need: int) -> Check:
    base = _existing_ancestor(cfg.runtime.paths.checkpoints)
    if not base.is_dir():
        return Check("disk", True, f"{base} is not a folder (reported above)")
    free = shutil.disk_usage(base).free
    detail = f"{human_bytes(free)} free at {base}, checkpoints need about {human_bytes(need)}"
    return Check("disk", free >= need, detail)


def _volume(path: Path) -> tuple[int, int]:
    """(device, bytes free) of the file system ``path`` lies on."""
    return path.stat().st_dev, shutil.disk_usage(path).free


def scratch_space(
    cfg: Config, need: int, scratch: Path, volume: Callable[[Path], tuple[int, int]] = _volume
) -> Check:
    """The scratch volume ($HALO_SCRATCH, or the one halo.scratch finds) against what the job's
    checkpoints need: a warning, not a failure. Scratch holds the exports, caches and
    temporary copies of what the run makes; the checkpoint folder's own shortfall is the
    `disk` check's failure."""
    try:
        device, have = volume(_existing_ancestor(scratch))
        same = device == volume(_existing_ancestor(cfg.runtime.paths.checkpoints))[0]
    except OSError as exc:
        return Check("scratch", True, f"{scratch}: free space unknown ({exc.strerror or exc})")
    if same:
        return Check("scratch", True, f"{scratch}: on the checkpoints' volume (see disk)")
    keep = cfg.checkpoint.keep_last or 10
    if have >= need:
        detail = (
            f"{human_bytes(have)} free at {scratch}, checkpoints need about {human_bytes(need)}"
        )
        return Check("scratch", True, detail)
    detail = (
        f"warning: {human_bytes(have)} free at {scratch}, less than the job's checkpoints need: "
        f"about {human_bytes(need)} ({n_params(cfg):,} parameters x {BYTES_PER_PARAM} bytes "
        f"x {keep + 1} checkpoints); set HALO_SCRATCH to a larger volume"
    )
    return Check("scratch", True, detail, warn=True)


def parallelism(cfg: Config, nproc: int, cuda: bool) -> Check:
    mode = cfg.runtime.parallel_mode
    if nproc > 1 and mode == "none":
        return Check("runtime.parallel_mode", False, f"none cannot run --nproc {nproc}")
    if cfg.training.global_batch_size % nproc:
        return Check(
            "training.global_batch_size",
            False,
            f"{cfg.training.global_batch_size} does not divide over --nproc {nproc}",
        )
    if cfg.training.precision == "bf16" and not cuda:
        return Check("training.precision", True, "bf16 on the CPU works but is slow")
    return Check("runtime.parallel_mode", True, f"{mode} with {nproc} process(es)")


def n_params(cfg: Config) -> int:
    """Roughly: a decoder's weights from its config fields (0 when they are unknown)."""
    a = _arch(cfg)
    try:
        h, layers = int(a["hidden_size"]), int(a["num_hidden_layers"])  # type: ignore[call-overload]
        heads = int(a.get("num_attention_heads", 1))  # type: ignore[call-overload]
        kv = int(a.get("num_key_value_heads", heads))  # type: ignore[call-overload]
        hd = int(a.get("head_dim") or h // heads)  # type: ignore[call-overload]
        inter = int(a.get("intermediate_size", 4 * h))  # type: ignore[call-overload]
        vocab = int(a.get("vocab_size", 32000))  # type: ignore[call-overload]
    except (KeyError, TypeError, ValueError):
        return 0
    tied = bool(a.get("tie_word_embeddings", False))
    per_layer = h * hd * (2 * heads + 2 * kv) + 3 * h * inter + 2 * h
    return layers * per_layer + vocab * h * (1 if tied else 2) + h


def driver() -> Check:
    """The NVIDIA driver against the images' CUDA 13.0 (fine where there is no GPU at all)."""
    from halo.train.launch.driver import check

    found = check()
    return Check("driver", found.ok, found.detail)


def gather(cfg: Config, nproc: int, gpu_count: int) -> list[Check]:
    inputs = [s.path for s in cfg.data.sources("train") + cfg.data.sources("eval")]
    # s3:// sources are checked where they are read (halo.train.data.s3data: credentials, cache).
    missing = [str(p) for p in inputs if isinstance(p, Path) and not p.is_file()]
    return [
        Check(
            "data",
            not missing,
            ", ".join(missing) + " not found" if missing else f"{len(inputs)} file(s)",
        ),
        base_model(cfg),
        tokenizer(cfg),
        driver(),
        devices(cfg, gpu_count, nproc),
        parallelism(cfg, nproc, gpu_count > 0),
        *outputs(cfg),
        scratch_space(cfg, checkpoint_bytes(cfg, n_params(cfg)), scratch_choice(create=False).path),
    ]


def failures(checks: list[Check]) -> None:
    """Every warning on stderr, then one error with every failed check."""
    for c in checks:
        if c.warn:
            print(f"halo: {c.name}: {c.detail}", file=sys.stderr, flush=True)
    bad = [c for c in checks if not c.ok]
    if bad:
        raise HaloError("preflight failed:\n  " + "\n  ".join(f"{c.name}: {c.detail}" for c in bad))


# What an NVIDIA driver puts on a machine (a container gets them from the NVIDIA runtime; WSL's
# driver is /dev/dxg). Where none is, CUDA can see no GPU, and torch is not asked.
NVIDIA_DRIVER_PATHS = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/dxg")


def gpu_count(driver_paths: tuple[str, ...] = NVIDIA_DRIVER_PATHS) -> int:
    """GPUs visible to torch, or 0 where torch is absent (the edge of this module).

    Without a driver the answer is 0 without importing torch: the launcher would import it
    only to count, seconds before the trainer imports it again (21 s under qemu)."""
    if not any(Path(p).exists() for p in driver_paths):
        return 0
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
