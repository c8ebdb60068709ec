"""The run config: one YAML file -> validated dataclasses.

`runtime` describes the container (job name, paths, devices, parallelism, environment); the
other sections describe training. Validation collects every problem, each as
``<key path>: <what was expected>``, and rejects unknown keys. Relative paths in the YAML are
relative to the YAML file; relative paths given as command-line overrides are relative to the
current directory (that is where the person typing them is).
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from halo.errors import HaloError


@dataclass
class Paths:
    checkpoints: Path = Path("runs/checkpoints")
    logs: Path = Path("runs/logs")


@dataclass
class Runtime:
    job_name: str
    paths: Paths = field(default_factory=Paths)
    # GPU devices the job may use: "all", or a list of indices (sets CUDA_VISIBLE_DEVICES).
    devices: Literal["all"] | list[int] = "all"
    # auto: none for one process; fsdp on GPUs, ddp on the CPU for several.
    parallel_mode: Literal["auto", "none", "ddp", "fsdp"] = "auto"
    # auto: python for one process, torchrun for several.
    launcher: Literal["auto", "python", "torchrun", "accelerate"] = "auto"
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Model:
    # A model directory (config.json, model.safetensors, tokenizer.json) to start from;
    # unset: a fresh model from the fields below, initialised from training.seed.
    init_from: Path | None = None
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = True
    attention: Literal["auto", "sdpa", "fa2", "fa3", "fa4"] = "auto"


@dataclass
class Data:
    train: Path
    # Longer examples are truncated (SFT) or dropped with a count (GRPO, DPO).
    max_seq_len: int = 256


@dataclass
class Optim:
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    grad_clip: float = 1.0
    scheduler: Literal["constant", "cosine", "linear"] = "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1


@dataclass
class Training:
    seed: int = 0
    # Sequences (SFT) or groups (GRPO) per optimizer step, summed over all processes.
    global_batch_size: int = 8
    # Per process per forward; the rest is gradient accumulation. Unset: the whole share.
    micro_batch_size: int | None = None
    epochs: int = 1
    # Stops earlier than `epochs` when set.
    max_steps: int | None = None
    precision: Literal["fp32", "bf16"] = "fp32"


@dataclass
class Checkpoint:
    # 0: only at the end (and on SIGTERM).
    every_steps: int = 0
    # Complete checkpoints to keep; 0 keeps all.
    keep_last: int = 2
    resume: bool = True


@dataclass
class Logging:
    every_steps: int = 1


@dataclass
class Grpo:
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    # reference: the frozen starting model generated the completions (the behaviour policy).
    # current: the policy at the start of each batch, updated updates_per_batch times.
    old_policy: Literal["reference", "current"] = "reference"
    updates_per_batch: int = 1
    adv_eps: float = 1e-6


@dataclass
class Dpo:
    beta: float = 0.1


@dataclass
class Config:
    runtime: Runtime
    data: Data
    model: Model = field(default_factory=Model)
    optim: Optim = field(default_factory=Optim)
    training: Training = field(default_factory=Training)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    logging: Logging = field(default_factory=Logging)
    grpo: Grpo | None = None
    dpo: Dpo | None = None

    @property
    def job_dir(self) -> Path:
        return self.runtime.paths.checkpoints / self.runtime.job_name

    @property
    def log_dir(self) -> Path:
        return self.runtime.paths.logs / self.runtime.job_name


# Sections only one method reads; elsewhere they are a mistake worth reporting.
METHOD_SECTIONS = {"grpo": "offline-grpo", "dpo": "preference/dpo"}


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads `1e-5` as a string; people mean a float."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)$"),
    list("-+0123456789"),
)


def parse_yaml(text: str, where: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise HaloError(f"{where}: not valid YAML: {' '.join(str(exc).split())}") from exc


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise HaloError(f"{path}: cannot read config ({exc.strerror})") from exc
    data = parse_yaml(text, str(path))
    if not isinstance(data, dict):
        raise HaloError(f"{path}: expected a mapping of sections at the top level")
    return data


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "mapping of strings"
    if tp is type(None):
        return "null"
    if tp is Path:
        return "path"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _got(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _convert(tp: Any, value: Any, key: str, errors: list[str]) -> Any:
    """``value`` as type ``tp``, or a recorded error (and None)."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        others = [a for a in args if a is not type(None)]
        if len(others) == 1:
            # `X | None` with a value: report X's own, more precise, problems.
            return _convert(others[0], value, key, errors)
        for arg in others:
            trial: list[str] = []
            out = _convert(arg, value, key, trial)
            if not trial:
                return out
        errors.append(f"{key}: expected {_type_name(tp)}, got {_got(value)} {value!r}")
        return None
    if tp is type(None):
        if value is not None:
            errors.append(f"{key}: expected null")
        return None
    if origin is Literal:
        if value not in typing.get_args(tp):
            errors.append(f"{key}: expected one of {_type_name(tp)}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            errors.append(f"{key}: expected {_type_name(tp)}, got {_got(value)}")
            return None
        (arg,) = typing.get_args(tp)
        return [_convert(arg, v, f"{key}[{i}]", errors) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            errors.append(f"{key}: expected {_type_name(tp)}, got {_got(value)}")
            return None
        out = {}
        for k, v in value.items():
            if not isinstance(v, str | int | float) or isinstance(v, bool):
                errors.append(f"{key}.{k}: expected a string, got {_got(v)}")
            out[str(k)] = str(v)
        return out
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key, errors)
    if tp is bool:
        if not isinstance(value, bool):
            errors.append(f"{key}: expected bool, got {_got(value)} {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(f"{key}: expected int, got {_got(value)} {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            errors.append(f"{key}: expected float, got {_got(value)} {value!r}")
            return value
        return float(value)
    if tp is str:
        if not isinstance(value, str) or not value:
            errors.append(f"{key}: expected a non-empty string, got {_got(value)} {value!r}")
        return value
    if tp is Path:
        if not isinstance(value, str) or not value:
            errors.append(f"{key}: expected a path (string), got {_got(value)} {value!r}")
            return None
        return Path(value)
    raise TypeError(f"unsupported config type {tp!r}")  # a schema bug, not user input


def _build(cls: type, value: Any, key: str, errors: list[str]) -> Any:
    where = f"{key}: " if key else ""
    if not isinstance(value, dict):
        errors.append(f"{where or 'config: '}expected a mapping, got {_got(value)}")
        return None
    before = len(errors)
    hints = typing.get_type_hints(cls)
    names = {f.name: f for f in dataclasses.fields(cls)}
    for k in value:
        if k not in names:
            errors.append(f"{key + '.' if key else ''}{k}: unknown key (known: {', '.join(names)})")
    kwargs = {}
    for name, f in names.items():
        sub = f"{key}.{name}" if key else name
        if name in value:
            kwargs[name] = _convert(hints[name], value[name], sub, errors)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            errors.append(f"{sub}: required key is missing")
    if len(errors) > before:
        # Something below was wrong; the caller reports the errors and never sees this object.
        return None
    try:
        return cls(**kwargs)
    except TypeError:
        return None


def _check_values(cfg: Config, method: str | None, raw: dict[str, Any], errors: list[str]) -> None:
    """Rules that span keys or bound values; type errors were found already."""

    def positive(key: str, v: int | float | None, allow_zero: bool = False) -> None:
        if v is not None and (v < 0 or (v == 0 and not allow_zero)):
            errors.append(f"{key}: expected {'>= 0' if allow_zero else '> 0'}, got {v}")

    t, m, o = cfg.training, cfg.model, cfg.optim
    positive("training.global_batch_size", t.global_batch_size)
    positive("training.micro_batch_size", t.micro_batch_size)
    positive("training.epochs", t.epochs)
    positive("training.max_steps", t.max_steps)
    positive("optim.lr", o.lr)
    positive("optim.warmup_steps", o.warmup_steps, allow_zero=True)
    positive("optim.grad_clip", o.grad_clip, allow_zero=True)
    positive("checkpoint.every_steps", cfg.checkpoint.every_steps, allow_zero=True)
    positive("checkpoint.keep_last", cfg.checkpoint.keep_last, allow_zero=True)
    positive("logging.every_steps", cfg.logging.every_steps)
    positive("data.max_seq_len", cfg.data.max_seq_len)
    for k in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size"):
        positive(f"model.{k}", getattr(m, k))
    if m.num_heads and m.hidden_size % m.num_heads:
        errors.append(
            f"model.hidden_size: {m.hidden_size} is not divisible by num_heads {m.num_heads}"
        )
    if m.num_heads and m.num_kv_heads and m.num_heads % m.num_kv_heads:
        errors.append(
            f"model.num_kv_heads: {m.num_kv_heads} does not divide num_heads {m.num_heads}"
        )
    if m.num_heads and (m.hidden_size // m.num_heads) % 2:
        errors.append("model.hidden_size: head dim (hidden_size / num_heads) must be even for RoPE")
    if cfg.data.max_seq_len > m.max_seq_len:
        errors.append(
            f"data.max_seq_len: {cfg.data.max_seq_len} exceeds model.max_seq_len {m.max_seq_len}"
        )
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        errors.append(f"optim.betas: expected two numbers in [0, 1), got {o.betas}")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", cfg.runtime.job_name):
        errors.append(
            f"runtime.job_name: expected letters, digits, '.', '_' or '-', got {cfg.runtime.job_name!r}"
        )
    if method is not None:
        for section, owner in METHOD_SECTIONS.items():
            if section in raw and owner != method:
                errors.append(f"{section}: section is for method {owner}, not {method}")
    if cfg.grpo is not None:
        positive("grpo.clip_eps", cfg.grpo.clip_eps)
        positive("grpo.kl_coef", cfg.grpo.kl_coef, allow_zero=True)
        positive("grpo.updates_per_batch", cfg.grpo.updates_per_batch)


def _check_paths(raw: dict[str, Any], errors: list[str]) -> None:
    """Input paths must exist; checked even when other keys are wrong, so all show at once."""
    for section, key, kind in (("data", "train", "file"), ("model", "init_from", "directory")):
        v = raw.get(section, {}).get(key) if isinstance(raw.get(section), dict) else None
        if isinstance(v, str) and v:
            ok = Path(v).is_file() if kind == "file" else Path(v).is_dir()
            if not ok:
                errors.append(f"{section}.{key}: {kind} not found: {v}")


def _resolve_paths(raw: dict[str, Any], base: Path) -> None:
    """Make the YAML's relative paths relative to the YAML file (in place, before building)."""

    def fix(section: dict[str, Any], key: str) -> None:
        v = section.get(key)
        if isinstance(v, str) and v and not Path(v).is_absolute():
            section[key] = str((base / v).resolve())

    rt = raw.get("runtime")
    if isinstance(rt, dict) and isinstance(rt.get("paths"), dict):
        for k in ("checkpoints", "logs"):
            fix(rt["paths"], k)
    elif isinstance(rt, dict) and "paths" not in rt:
        rt["paths"] = {k: str((base / v).resolve()) for k, v in dataclasses.asdict(Paths()).items()}
    if isinstance(raw.get("data"), dict):
        fix(raw["data"], "train")
    if isinstance(raw.get("model"), dict):
        fix(raw["model"], "init_from")


def from_dict(raw: dict[str, Any], method: str | None, where: str) -> Config:
    errors: list[str] = []
    cfg = _build(Config, raw, "", errors)
    if cfg is not None and not errors:
        _check_values(cfg, method, raw, errors)
    _check_paths(raw, errors)
    if method == "offline-grpo" and cfg is not None and cfg.grpo is None:
        cfg.grpo = Grpo()
    if method == "preference/dpo" and cfg is not None and cfg.dpo is None:
        cfg.dpo = Dpo()
    if errors:
        n = len(errors)
        raise HaloError(
            f"{where}: {n} problem{'s' if n > 1 else ''} in the config:\n  " + "\n  ".join(errors)
        )
    return cfg


def load(path: Path, method: str | None, overrides: list[str] | None = None) -> Config:
    """Read, resolve paths, apply ``--key=value`` overrides, validate."""
    from halo.train import overrides as ov

    path = path.resolve()
    raw = read_yaml(path)
    _resolve_paths(raw, path.parent)
    ov.apply(raw, ov.parse(overrides or []), schema=Config)
    return from_dict(raw, method, str(path))


def to_dict(cfg: Config) -> dict[str, Any]:
    """Plain data (paths as strings, unset method sections dropped) for YAML/JSON output."""

    def plain(v: Any) -> Any:
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    return {k: plain(v) for k, v in dataclasses.asdict(cfg).items() if v is not None}


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
