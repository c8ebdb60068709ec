"""Reading one YAML mapping with every error naming its file and key (catalog, CI matrix)."""

from __future__ import annotations

from typing import Any

from halo.errors import HaloError


class Fields:
    """Reads one mapping, remembering where it came from, so each error names file and key."""

    def __init__(self, data: object, where: str, allowed: set[str]) -> None:
        if not isinstance(data, dict):
            raise HaloError(f"{where}: expected a mapping, got {type(data).__name__}")
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise HaloError(
                f"{where}: unknown key '{unknown[0]}' (allowed: {', '.join(sorted(allowed))})"
            )
        self.data: dict[str, Any] = data
        self.where = where

    def str(self, key: str, default: str | None = None) -> str:
        value = self.data.get(key, default)
        if value is None:
            raise HaloError(f"{self.where}.{key}: required")
        if not isinstance(value, str) or not value:
            raise HaloError(f"{self.where}.{key}: expected a non-empty string, got {value!r}")
        return value

    def strs(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise HaloError(f"{self.where}.{key}: expected a list of strings, got {value!r}")
        return tuple(value)
