"""Source pins (pins/sources.toml): what the index does not publish, pinned by commit and content.

Each pin is a derivation's inputs: repository, exact commit, a content hash of the source
tree, the sets that build it and the build knobs. Whether commit and hash are well formed is
an invariant (halo.pins.invariants), so a missing hash is reported with the other rules.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from halo.errors import HaloError
from halo.pins.lockfile import normalize

SOURCES_FILE = "sources.toml"
PIN_KEYS = frozenset(
    {
        "distribution",
        "version",
        "repository",
        "commit",
        "subdirectory",
        "content-sha256",
        "sets",
        "cuda-arch",
        "env",
        "submodule",
    }
)
SUBMODULE_KEYS = frozenset({"path", "repository", "commit", "content-sha256", "subdirectory"})


@dataclass(frozen=True)
class Submodule:
    path: str
    repository: str
    commit: str
    content_sha256: str
    # The part of the submodule the build uses, and that content_sha256 covers ("" = all).
    subdirectory: str = ""


@dataclass(frozen=True)
class SourcePin:
    name: str
    distribution: str
    version: str
    repository: str
    commit: str
    content_sha256: str
    sets: tuple[str, ...]
    subdirectory: str = ""
    cuda_arch: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    submodules: tuple[Submodule, ...] = ()

    @property
    def key(self) -> str:
        """The name invariants compare against lock packages (the built distribution)."""
        return normalize(self.distribution)


def _str(table: dict, key: str, where: str, default: str | None = None) -> str:
    if key not in table:
        if default is not None:
            return default
        raise HaloError(f"{where}: missing key '{key}'")
    if not isinstance(table[key], str):
        raise HaloError(f"{where}: key '{key}' must be a string")
    return table[key]


def _str_map(table: dict, key: str, where: str) -> dict[str, str]:
    value = table.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise HaloError(f"{where}: key '{key}' must be a table of strings")
    return dict(sorted(value.items()))


def _parse_pin(name: str, table: object, origin: str) -> SourcePin:
    where = f"{origin}: [source.{name}]"
    if not isinstance(table, dict):
        raise HaloError(f"{where}: must be a table")
    unknown = sorted(set(table) - PIN_KEYS)
    if unknown:
        raise HaloError(
            f"{where}: unknown key '{unknown[0]}' (expected: {', '.join(sorted(PIN_KEYS))})"
        )
    sets = table.get("sets")
    if not isinstance(sets, list) or not sets or not all(isinstance(s, str) for s in sets):
        raise HaloError(f"{where}: key 'sets' must be a non-empty list of set names")
    subs = []
    for i, raw in enumerate(table.get("submodule", [])):
        sub_where = f"{where} submodule[{i}]"
        if not isinstance(raw, dict) or set(raw) - SUBMODULE_KEYS:
            raise HaloError(f"{sub_where}: expected keys {', '.join(sorted(SUBMODULE_KEYS))}")
        subs.append(
            Submodule(
                path=_str(raw, "path", sub_where),
                repository=_str(raw, "repository", sub_where),
                commit=_str(raw, "commit", sub_where, ""),
                content_sha256=_str(raw, "content-sha256", sub_where, ""),
                subdirectory=_str(raw, "subdirectory", sub_where, ""),
            )
        )
    return SourcePin(
        name=name,
        distribution=_str(table, "distribution", where),
        version=_str(table, "version", where),
        repository=_str(table, "repository", where),
        # Missing or malformed commit/hash are reported by the source-pinned invariant.
        commit=_str(table, "commit", where, ""),
        content_sha256=_str(table, "content-sha256", where, ""),
        sets=tuple(sets),
        subdirectory=_str(table, "subdirectory", where, ""),
        cuda_arch=_str_map(table, "cuda-arch", where),
        env=_str_map(table, "env", where),
        submodules=tuple(subs),
    )


def parse_source_pins(text: str, origin: str) -> tuple[SourcePin, ...]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise HaloError(f"{origin}: not valid TOML ({exc})") from None
    unknown = sorted(set(data) - {"source"})
    if unknown:
        raise HaloError(f"{origin}: unknown top-level key '{unknown[0]}' (expected [source.NAME])")
    table = data.get("source", {})
    if not isinstance(table, dict):
        raise HaloError(f"{origin}: expected [source.NAME] tables")
    return tuple(_parse_pin(name, raw, origin) for name, raw in table.items())


def load_source_pins(pins_dir: Path) -> tuple[SourcePin, ...]:
    path = pins_dir / SOURCES_FILE
    if not path.is_file():
        return ()
    return parse_source_pins(path.read_text(), str(path))
