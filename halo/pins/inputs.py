"""The inputs of the pin sets: pins/sets.toml and the requirement/constraint files it names.

Reading them is pure and fast (tomllib, a few small files): `halo pins check` uses the
inputs hash to tell a lock that is older than its inputs.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field

from halo.errors import HaloError
from halo.hashing import sha256_json
from halo.pins.lockfile import normalize
from halo.schema import Name, Problems, Strict, matches, read_text, read_toml

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


def _utc_instant(value: str) -> str:
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError("expected an RFC 3339 instant like '2026-11-25T00:00:00Z'") from None
    if not value.endswith("Z"):
        raise ValueError("expected an instant in UTC (ending in 'Z')")
    return value


FileName = Annotated[
    str, matches(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", "a file name in the folder (no path)")
]
PackageName = Annotated[str, matches(NAME_RE.pattern[1:-1], "a package name")]


class SetSpec(Strict):
    """One [set.NAME] table; every key is required, so a set says everything it means."""

    requirements: Annotated[list[FileName], Field(min_length=1)]
    constraints: list[FileName]
    exclude: list[PackageName]
    python: Annotated[str, matches(PYTHON_RE.pattern[1:-1], "a Python version like '3.12'")]
    platform: Annotated[
        str, matches(PLATFORM_RE.pattern[1:-1], "a target like 'x86_64-manylinux_2_39'")
    ]
    exclude_newer: Annotated[str, AfterValidator(_utc_instant)] = Field(alias="exclude-newer")
    prerelease: list[PackageName]
    substitutes: bool
    overrides: list[FileName] = Field(default_factory=list)


class PlatformSpec(Strict):
    """One [platform.ARCH] table: the sets resolved again for another platform.

    Each named set gets a twin, SET-ARCH (pins/pylock.SET-ARCH.toml), with the same
    requirements, constraints, overrides, excludes and pre-releases and this ``platform``:
    one list of inputs, so the platforms cannot drift apart by an edit to one of them.
    """

    platform: Annotated[
        str, matches(PLATFORM_RE.pattern[1:-1], "a target like 'aarch64-manylinux_2_36'")
    ]
    sets: Annotated[list[Name], Field(min_length=1)]


class SetsFile(Strict):
    set: Annotated[dict[Name, object], Field(min_length=1)]
    platform: dict[Annotated[str, matches(r"arm64", "a platform: arm64")], PlatformSpec] = Field(
        default_factory=dict
    )


def _read_input(pins_dir: Path, sub: str, name: str) -> InputFile:
    rel = f"{sub}/{name}"
    return InputFile(path=rel, text=read_text(pins_dir / rel))


def _parse_set(pins_dir: Path, name: str, raw: object, found: Problems) -> SetInputs | None:
    where = f"set.{name}"
    spec = found.model(SetSpec, raw, where)
    if spec is None:
        return None
    folders = (
        ("requirements", REQUIREMENTS_DIR),
        ("constraints", CONSTRAINTS_DIR),
        ("overrides", OVERRIDES_DIR),
    )
    for key, sub in folders:
        for i, f in enumerate(getattr(spec, key)):
            if not (pins_dir / sub / f).is_file():
                found.add(f"{where}.{key}[{i}]", f"'{f}' is not a file in pins/{sub}/")
    if found.found:
        return None
    return SetInputs(
        name=name,
        python=spec.python,
        platform=spec.platform,
        exclude_newer=spec.exclude_newer,
        requirements=tuple(_read_input(pins_dir, REQUIREMENTS_DIR, f) for f in spec.requirements),
        constraints=tuple(_read_input(pins_dir, CONSTRAINTS_DIR, f) for f in spec.constraints),
        exclude=tuple(normalize(n) for n in spec.exclude),
        prerelease=tuple(normalize(n) for n in spec.prerelease),
        substitutes=spec.substitutes,
        overrides=tuple(_read_input(pins_dir, OVERRIDES_DIR, f) for f in spec.overrides),
    )


def load_inputs(pins_dir: Path) -> PinInputs:
    """pins/sets.toml and the files it names, read through halo.schema: every problem of the
    file is reported at once, by key path (``set.cpu.python: ...``)."""
    path = pins_dir / SETS_FILE
    found = Problems(str(path))
    top = found.model(SetsFile, read_toml(path))
    found.check()
    assert top is not None
    sets = {name: _parse_set(pins_dir, name, raw, found) for name, raw in top.set.items()}
    found.check()
    out = {n: s for n, s in sets.items() if s is not None}
    for arch, spec in top.platform.items():
        for i, name in enumerate(spec.sets):
            twin = f"{name}-{arch}"
            if name not in out:
                found.add(f"platform.{arch}.sets[{i}]", f"'{name}' is not a [set.NAME] here")
            elif twin in out:
                found.add(f"platform.{arch}.sets[{i}]", f"'{twin}' is a [set.NAME] already")
            elif out[name].arch == spec.platform.split("-", 1)[0]:
                found.add(f"platform.{arch}.platform", f"set {name} is for {spec.platform} already")
            else:
                out[twin] = dataclasses.replace(out[name], name=twin, platform=spec.platform)
    found.check()
    return PinInputs(pins_dir=pins_dir, sets=out)
