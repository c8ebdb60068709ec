"""The lock format: names, versions, the artifact files chosen for the target, their sha256.

A lock names no index host: where an artifact is downloaded from is configuration
(see halo.store.sources). The file is TOML, written in a fixed order so that
re-locking the same inputs gives the same bytes.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from halo.errors import HaloError

LOCK_VERSION = 1
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Artifact:
    file: str
    sha256: str
    size: int | None = None

    @property
    def is_wheel(self) -> bool:
        return self.file.endswith(".whl")


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    artifacts: tuple[Artifact, ...]
    dependencies: tuple[str, ...] = ()

    @property
    def prerelease(self) -> bool:
        from packaging.version import Version

        return Version(self.version).is_prerelease


@dataclass(frozen=True)
class Lock:
    set: str
    python: str
    platform: str
    inputs_sha256: str
    packages: tuple[Package, ...]
    extra: dict[str, object] = field(default_factory=dict)

    def package(self, name: str) -> Package | None:
        key = normalize(name)
        return next((p for p in self.packages if normalize(p.name) == key), None)

    @property
    def artifacts(self) -> tuple[Artifact, ...]:
        return tuple(a for p in self.packages for a in p.artifacts)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req(table: dict, key: str, kind: type, where: str) -> object:
    if key not in table:
        raise HaloError(f"{where}: missing key '{key}'")
    value = table[key]
    if not isinstance(value, kind):
        raise HaloError(f"{where}: key '{key}' must be {kind.__name__}, got {type(value).__name__}")
    return value


def parse_lock(text: str, origin: str) -> Lock:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise HaloError(f"{origin}: not a valid lock (TOML: {exc})") from None
    if data.get("version") != LOCK_VERSION:
        raise HaloError(f"{origin}: key 'version' must be {LOCK_VERSION}")
    packages = []
    for i, raw in enumerate(_req(data, "package", list, origin)):  # type: ignore[arg-type]
        where = f"{origin}: package[{i}]"
        name = str(_req(raw, "name", str, where))
        where = f"{origin}: package '{name}'"
        arts = []
        for raw_art in raw.get("artifact", []):
            art = Artifact(
                file=str(_req(raw_art, "file", str, where)),
                sha256=str(_req(raw_art, "sha256", str, where)),
                size=raw_art.get("size"),
            )
            arts.append(art)
        packages.append(
            Package(
                name=name,
                version=str(_req(raw, "version", str, where)),
                artifacts=tuple(arts),
                dependencies=tuple(raw.get("dependencies", ())),
            )
        )
    known = {"version", "set", "python", "platform", "inputs-sha256", "package"}
    return Lock(
        set=str(_req(data, "set", str, origin)),
        python=str(_req(data, "python", str, origin)),
        platform=str(_req(data, "platform", str, origin)),
        inputs_sha256=str(_req(data, "inputs-sha256", str, origin)),
        packages=tuple(packages),
        extra={k: v for k, v in data.items() if k not in known},
    )


def load_lock(path: Path) -> Lock:
    if not path.is_file():
        raise HaloError(f"{path}: lock not found; run `halo pins lock {path.stem}`")
    return parse_lock(path.read_text(), str(path))


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _toml_str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to a lock")


def render_lock(lock: Lock, header: str) -> str:
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [
        f"version = {LOCK_VERSION}",
        f"set = {_toml_str(lock.set)}",
        f"python = {_toml_str(lock.python)}",
        f"platform = {_toml_str(lock.platform)}",
        f"inputs-sha256 = {_toml_str(lock.inputs_sha256)}",
    ]
    lines += [f"{k} = {_toml_value(v)}" for k, v in sorted(lock.extra.items())]
    for pkg in sorted(lock.packages, key=lambda p: normalize(p.name)):
        lines += [
            "",
            "[[package]]",
            f"name = {_toml_str(pkg.name)}",
            f"version = {_toml_str(pkg.version)}",
        ]
        if pkg.dependencies:
            lines.append(f"dependencies = {_toml_value(sorted(pkg.dependencies))}")
        for art in sorted(pkg.artifacts, key=lambda a: a.file):
            lines += [
                "[[package.artifact]]",
                f"file = {_toml_str(art.file)}",
                f"sha256 = {_toml_str(art.sha256)}",
            ]
            if art.size is not None:
                lines.append(f"size = {art.size}")
    return "\n".join(lines) + "\n"
