"""$HALO_DATA_ROOT: the one knob for what a run keeps beside its checkpoints (S3 dataset cache,
profiler traces). The seed's default, ~/.cache/halo, when it is unset."""

from __future__ import annotations

import os
from pathlib import Path

ENV = "HALO_DATA_ROOT"


def data_root() -> Path:
    value = os.environ.get(ENV)
    return Path(value).expanduser() if value else Path.home() / ".cache" / "halo"
