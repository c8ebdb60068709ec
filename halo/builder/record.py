"""What the store keeps of a realised derivation: ``derivations/<hash>.json`` next to its wheel.

The record says which wheel (by sha256) a derivation's inputs made. It is read through a
strict schema and trusted only with its wheel hashing right *now* (the store's stamps spare
re-hashing an untouched file); anything else counts as not built. The same record travels
with the wheel through the binary cache (halo.cache), where it is checked again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from halo.atomic import write_text
from halo.errors import HaloError
from halo.hashing import sha256_json
from halo.report import say
from halo.schema import validate
from halo.store.store import Store

SHA256 = r"^[0-9a-f]{64}$"


class Compile(BaseModel):
    """How long the compile took where it ran: the plan's estimates come from these."""

    model_config = ConfigDict(extra="forbid", strict=True)
    seconds: float = Field(ge=0)
    jobs: int = Field(ge=1)
    cores: int = Field(ge=1)


class DerivationRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(min_length=1)
    hash: str = Field(pattern=SHA256)
    wheel: str = Field(pattern=r"^[A-Za-z0-9_.+-]+\.whl$")
    sha256: str = Field(pattern=SHA256)
    inputs: dict[str, Any]
    compile: Compile | None = None

    def check(self) -> str | None:
        """Why this record cannot be what it claims (its inputs must hash to its name)."""
        got = sha256_json(self.inputs)
        return None if got == self.hash else f"its inputs hash to {got[:12]}, not {self.hash[:12]}"

    def to_json(self) -> str:
        return json.dumps(self.model_dump(exclude_none=True), indent=2, sort_keys=True) + "\n"


def record_path(store: Store, drv_hash: str) -> Path:
    return store.root / "derivations" / f"{drv_hash}.json"


def parse_record(text: str, origin: str) -> DerivationRecord:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise HaloError(f"{origin}: not JSON ({exc})") from None
    record = validate(DerivationRecord, data, origin)
    if problem := record.check():
        raise HaloError(f"{origin}: {problem}")
    return record


def read_record(store: Store, drv_hash: str) -> DerivationRecord | None:
    """The record of ``drv_hash`` whose wheel is in the store and hashes right, else None."""
    path = record_path(store, drv_hash)
    if not path.is_file():
        return None
    try:
        record = parse_record(path.read_text(encoding="utf-8"), str(path))
    except (HaloError, OSError, UnicodeDecodeError) as exc:
        say(f"derivation {drv_hash[:12]}: record unusable ({exc}); it counts as not built")
        return None
    if record.hash != drv_hash:
        say(f"derivation {drv_hash[:12]}: record names {record.hash[:12]}; it counts as not built")
        return None
    if not store.has(record.sha256):
        return None
    if store.check(record.sha256) is not None:  # the stamp spares the hash of an untouched file
        say(f"derivation {drv_hash[:12]}: {record.wheel} in the store is corrupted; not used")
        return None
    return record


def write_record(store: Store, record: DerivationRecord) -> Path:
    path = record_path(store, record.hash)
    write_text(path, record.to_json())
    return path


def store_records(store: Store) -> list[DerivationRecord]:
    """Every parsable record in the store (for push and plan estimates), newest file last."""
    folder = store.root / "derivations"
    out = []
    for path in sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime):
        try:
            out.append(parse_record(path.read_text(encoding="utf-8"), str(path)))
        except (HaloError, OSError, UnicodeDecodeError):
            continue
    return out
