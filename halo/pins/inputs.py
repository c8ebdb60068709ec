"""The inputs of the pin sets: pins/sets.toml and the requirement/constraint files it names.

Reading them is pure and fast (tomllib, a few small files): `halo pins check` uses the
inputs hash to tell a lock that is older than its inputs.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from halo.errors import HaloError
from halo.hashing import sha256_json
from halo.pins.lockfile import normalize

SETS_FILE = "sets.toml"
REQUIREMENTS_DIR = "requirements"
CONSTRAINTS_DIR = "constraints"
OVERRIDES_DIR = "overrides"
# Bumped when the way a set is resolved changes (uv flags, artifact choice): every lock
# then reads as stale until re-locked.
RESOLVER_REVISION = 1

PLATFORM_RE = re.compile(r"^(?P<arch>x86_64|aarch64)-manylinux_(?P<major>2)_(?P<minor>\d+)$")
PYTHON_RE = re.compile(r"^3\.\d+$")
NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
SET_KEYS = frozenset(
    {
        "requirements",
        "constraints",
        "overrides",
        "exclude",
        "python",
        "platform",
        "exclude-newer",
        "prerelease",
        "substitutes",
    }
)


@dataclass(frozen=True)
class InputFile:
    """One requirement or constraint file, by its path relative to pins/."""

    path: str
    text: str

    def requirement_lines(self) -> tuple[str, ...]:
        lines = (line.split("#", 1)[0].strip() for line in self.text.splitlines())
        return tuple(line for line in lines if line)


@dataclass(frozen=True)
class SetInputs:
    name: str
    python: str
    platform: str
    exclude_newer: str
    requirements: tuple[InputFile, ...]
    constraints: tuple[InputFile, ...]
    exclude: tuple[str, ...]
    prerelease: tuple[str, ...]
    substitutes: bool
    # Requirements that replace every other requirement on the same package, however declared
    # (uv's --overrides): for a published package whose metadata names a build the index lacks.
    overrides: tuple[InputFile, ...] = ()

    @property
    def override_lines(self) -> tuple[str, ...]:
        return tuple(line for f in self.overrides for line in f.requirement_lines())

    @property
    def top_level(self) -> tuple[str, ...]:
        """The requirement lines, in file order: what `halo pins why` traces back to."""
        return tuple(line for f in self.requirements for line in f.requirement_lines())

    @property
    def glibc(self) -> tuple[int, int]:
        m = PLATFORM_RE.match(self.platform)
        assert m is not None  # validated on load
        return int(m["major"]), int(m["minor"])

    @property
    def arch(self) -> str:
        return self.platform.split("-", 1)[0]

    def sha256(self) -> str:
        return sha256_json(
            {
                "resolver-revision": RESOLVER_REVISION,
                "python": self.python,
                "platform": self.platform,
                "exclude-newer": self.exclude_newer,
                "requirements": [[f.path, f.text] for f in self.requirements],
                "constraints": [[f.path, f.text] for f in self.constraints],
                "overrides": [[f.path, f.text] for f in self.overrides],
                "exclude": list(self.exclude),
                "prerelease": list(self.prerelease),
                "substitutes": self.substitutes,
            }
        )


@dataclass(frozen=True)
class PinInputs:
    pins_dir: Path
    sets: dict[str, SetInputs]

    def select(self, names: list[str] | tuple[str, ...]) -> list[SetInputs]:
        """The named sets (all when none are named); an unknown name is bad input."""
        if not names:
            return list(self.sets.values())
        unknown = [n for n in names if n not in self.sets]
        if unknown:
            known = ", ".join(self.sets)
            raise HaloError(
                f"{self.pins_dir / SETS_FILE}: unknown pin set '{unknown[0]}' (expected one of: {known})"
            )
        return [self.sets[n] for n in names]


def _expect(table: dict, key: str, kind: type, where: str) -> object:
    if key not in table:
        raise HaloError(f"{where}: missing key '{key}'")
    value = table[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise HaloError(f"{where}: key '{key}' must be {_kind_name(kind)}")
    return value


def _kind_name(kind: type) -> str:
    return {str: "a string", list: "a list of strings", bool: "true or false"}.get(
        kind, kind.__name__
    )


def _str_list(table: dict, key: str, where: str) -> tuple[str, ...]:
    value = _expect(table, key, list, where)
    if not all(isinstance(v, str) for v in value):  # type: ignore[union-attr]
        raise HaloError(f"{where}: key '{key}' must be a list of strings")
    return tuple(value)  # type: ignore[arg-type]


def _read_input(pins_dir: Path, sub: str, name: str, where: str) -> InputFile:
    rel = f"{sub}/{name}"
    path = pins_dir / rel
    if "/" in name or "\\" in name or not path.is_file():
        raise HaloError(f"{where}: '{name}' is not a file in pins/{sub}/")
    return InputFile(path=rel, text=path.read_text())


def _parse_set(pins_dir: Path, name: str, table: object, origin: str) -> SetInputs:
    where = f"{origin}: [set.{name}]"
    if not isinstance(table, dict):
        raise HaloError(f"{where}: must be a table")
    unknown = sorted(set(table) - SET_KEYS)
    if unknown:
        raise HaloError(
            f"{where}: unknown key '{unknown[0]}' (expected: {', '.join(sorted(SET_KEYS))})"
        )
    python = str(_expect(table, "python", str, where))
    if not PYTHON_RE.match(python):
        raise HaloError(f"{where}: key 'python' must look like '3.12', got '{python}'")
    platform = str(_expect(table, "platform", str, where))
    if not PLATFORM_RE.match(platform):
        raise HaloError(
            f"{where}: key 'platform' must look like 'x86_64-manylinux_2_39', got '{platform}'"
        )
    exclude_newer = str(_expect(table, "exclude-newer", str, where))
    try:
        datetime.fromisoformat(exclude_newer.replace("Z", "+00:00"))
    except ValueError:
        raise HaloError(
            f"{where}: key 'exclude-newer' must be an RFC 3339 instant like "
            f"'2026-11-25T00:00:00Z', got '{exclude_newer}'"
        ) from None
    if not exclude_newer.endswith("Z"):
        raise HaloError(f"{where}: key 'exclude-newer' must be in UTC (end in 'Z')")
    names = {key: _str_list(table, key, where) for key in ("exclude", "prerelease")}
    for key, values in names.items():
        bad = [v for v in values if not NAME_RE.match(v)]
        if bad:
            raise HaloError(f"{where}: key '{key}' must list package names, got '{bad[0]}'")
    requirements = tuple(
        _read_input(pins_dir, REQUIREMENTS_DIR, f, where)
        for f in _str_list(table, "requirements", where)
    )
    if not requirements:
        raise HaloError(f"{where}: key 'requirements' must name at least one file")
    constraints = tuple(
        _read_input(pins_dir, CONSTRAINTS_DIR, f, where)
        for f in _str_list(table, "constraints", where)
    )
    overrides = tuple(
        _read_input(pins_dir, OVERRIDES_DIR, f, where)
        for f in (_str_list(table, "overrides", where) if "overrides" in table else ())
    )
    return SetInputs(
        name=name,
        python=python,
        platform=platform,
        exclude_newer=exclude_newer,
        requirements=requirements,
        constraints=constraints,
        exclude=tuple(normalize(n) for n in names["exclude"]),
        prerelease=tuple(normalize(n) for n in names["prerelease"]),
        substitutes=bool(_expect(table, "substitutes", bool, where)),
        overrides=overrides,
    )


def load_inputs(pins_dir: Path) -> PinInputs:
    path = pins_dir / SETS_FILE
    if not path.is_file():
        raise HaloError(f"{path}: not found (the pin sets' inputs)")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise HaloError(f"{path}: not valid TOML ({exc})") from None
    sets = data.get("set")
    if not isinstance(sets, dict) or not sets:
        raise HaloError(f"{path}: expected [set.NAME] tables")
    unknown = sorted(set(data) - {"set"})
    if unknown:
        raise HaloError(
            f"{path}: unknown top-level key '{unknown[0]}' (expected [set.NAME] tables)"
        )
    return PinInputs(
        pins_dir=pins_dir,
        sets={name: _parse_set(pins_dir, name, table, str(path)) for name, table in sets.items()},
    )
