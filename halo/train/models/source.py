"""Where a model's sizes come from, read as data (no torch): what the mesh checks and the
memory plan read on a login node that may have neither torch nor the weights.

``model.config`` when the config has it; else ``config.json`` of the model folder or of the
Hugging Face cache; for the seeds' Hub ids, halo.train.models.known when neither has it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from halo.train.models import known
from halo.train.models.arch import Arch, from_config

if TYPE_CHECKING:
    from halo.train.config import Config


@dataclass(frozen=True)
class Source:
    conf: dict[str, Any]
    where: str  # where the sizes were read, for the plan's first line


def _cached_config(repo_id: str) -> Path | None:
    """config.json of a Hub id in the Hugging Face cache (the snapshot refs/main names)."""
    from halo.train.models.hfcache import hub_cache

    root = hub_cache() / f"models--{repo_id.replace('/', '--')}"
    try:
        revision = (root / "refs" / "main").read_text().strip()
    except OSError:
        return None
    path = root / "snapshots" / revision / "config.json"
    return path if path.is_file() else None


def _full_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """A model.config dict with its class's defaults filled in (transformers' config classes
    need no torch); the dict as it is where transformers is absent."""
    from halo.train.models import model_config

    cls = model_config.config_class(str(fields.get("model_type", "")))
    if cls is None:
        return dict(fields)
    try:
        rest = {k: v for k, v in fields.items() if k != "model_type"}
        return {**cls(**rest).to_dict(), **fields}
    except Exception:  # validation reports the config's problems; the plan uses what it has
        return dict(fields)


def source(cfg: Config) -> Source | None:
    m = cfg.model
    if m.config is not None:
        return Source(_full_fields(m.config), "model.config")
    name = str(m.name_or_path)
    local = Path(name) / "config.json"
    cached = None if local.is_file() else _cached_config(name)
    for path in (local, cached):
        if path is not None and path.is_file():
            try:
                conf = json.loads(path.read_text())
            except (OSError, ValueError):
                return None  # the trainer names the broken file; the plan has nothing to add
            return Source(conf, str(path)) if isinstance(conf, dict) else None
    if name in known.PUBLISHED:
        return Source(dict(known.PUBLISHED[name]), f"{name} (the published config.json's sizes)")
    return None


def arch(cfg: Config) -> Arch | None:
    found = source(cfg)
    return from_config(found.conf) if found else None
