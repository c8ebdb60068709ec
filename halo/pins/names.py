"""Where a pin set's lock lives: PEP 751's file-name rule, without the lock's schema.

Kept apart from halo.pins.lockfile (which loads pydantic) because the input hash names the
lock's path on every build, the no-op one included, which does not parse the lock.
"""

from __future__ import annotations

from pathlib import Path


def lock_name(set_name: str) -> str:
    return f"pylock.{set_name}.toml"


def lock_path(pins_dir: Path, set_name: str) -> Path:
    return pins_dir / lock_name(set_name)
