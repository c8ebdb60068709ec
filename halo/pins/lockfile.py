"""The lock of a pin set: a PEP 751 file, `pins/pylock.SET.toml`. The one module that reads
and writes it; fetch, build, plan, invariants and the stack check all go through `load_lock`.

The standard part is what pip (`pip install -r pylock.SET.toml`), uv and scanners read: per
package its name, version, direct dependencies, and the one file the target installs (a wheel,
or an sdist when no wheel fits) with its size and sha256. A file is named by a relative
`path`, `wheels/FILE`, never by a URL: where it is downloaded from is configuration
(halo.sources), and `wheels/` next to a copy of the lock is where an offline install finds it
(the build context stages exactly that folder). Halo's own data, which the standard has no
field for, is under `[tool.halo]`: the set, its target, the inputs hash, exclude-newer, the
top-level requirement lines (roots for `halo pins why`), excluded packages, overrides and
allowed pre-releases.

Reading validates through halo.schema (UTF-8, TOML, a strict model; every problem by key
path); writing uses tomli-w, so there is no TOML escaper here. Same Lock in, same bytes out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from packaging.utils import canonicalize_name as normalize  # readers of locks import it here
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from halo.confine import name_problem
from halo.errors import HaloError
from halo.pins.names import lock_name, lock_path  # noqa: F401  (re-exported: readers use both)

LOCK_VERSION = "1.0"
CREATED_BY = "halo"
FILES_DIR = "wheels"
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
LOCK_NAME_RE = re.compile(r"^pylock\.(?P<set>[^.]+)\.toml$")  # PEP 751's file-name rule


@dataclass(frozen=True)
class Artifact:
    file: str
    sha256: str
    size: int | None = None

    @property
    def is_wheel(self) -> bool:
        return self.file.endswith(".whl")

    @property
    def path(self) -> str:
        """Where an offline install finds the file, relative to the lock."""
        return f"{FILES_DIR}/{self.file}"


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    artifacts: tuple[Artifact, ...]
    dependencies: tuple[str, ...] = ()
    # PEP 508: the environments this entry is for (None: every one). Two entries of one name
    # must not both hold for the lock's target; `halo pins check` refuses that.
    marker: str | None = None

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
    # [tool.halo] beyond the fields above: exclude-newer, requirements, excluded,
    # allow-prerelease, overrides.
    extra: dict[str, object] = field(default_factory=dict)
    # What the file says its interpreter is (requires-python, environments), checked against
    # `python` by `halo pins check`; empty in a Lock made in code, rendered from `python` and
    # `platform`, so no part of a Lock's identity.
    requires_python: str = field(default="", compare=False)
    environments: tuple[str, ...] = field(default=(), compare=False)

    def package(self, name: str) -> Package | None:
        """The first entry named ``name``; the invariants look at every one (`entries`)."""
        key = normalize(name)
        return next((p for p in self.packages if normalize(p.name) == key), None)

    def entries(self, name: str) -> tuple[Package, ...]:
        """Every entry named ``name``: a lock may hold several, told apart by their markers."""
        return self._by_name.get(normalize(name), ())

    @cached_property
    def _by_name(self) -> dict[str, tuple[Package, ...]]:
        # The rules ask for hundreds of names per lock: one pass, not one scan per name.
        out: dict[str, tuple[Package, ...]] = {}
        for p in self.packages:
            out[normalize(p.name)] = (*out.get(normalize(p.name), ()), p)
        return out

    @property
    def artifacts(self) -> tuple[Artifact, ...]:
        return tuple(a for p in self.packages for a in p.artifacts)


# --- the schema -------------------------------------------------------------------------


def _version(value: str) -> str:
    from packaging.version import InvalidVersion, Version

    try:
        Version(value)
    except InvalidVersion:
        raise ValueError("not a valid version (PEP 440)") from None
    return value


def _normalized(value: str) -> str:
    if normalize(value) != value:
        raise ValueError(f"package names are written normalized ('{normalize(value)}')")
    return value


def _marker(value: str) -> str:
    from packaging.markers import InvalidMarker, Marker

    try:
        Marker(value)
    except InvalidMarker:
        raise ValueError("not a PEP 508 environment marker") from None
    return value


def _specifier(value: str) -> str:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        raise ValueError("not a PEP 440 version specifier") from None
    return value


def _relative_file(value: str) -> str:
    name = value.removeprefix(f"{FILES_DIR}/")
    if name == value or name_problem(name) or "/" in name or name.startswith("."):
        raise ValueError(f"must be '{FILES_DIR}/' and a file name, relative to the lock")
    return value


Sha256 = Annotated[str, StringConstraints(pattern=SHA256_RE.pattern)]
VersionStr = Annotated[str, AfterValidator(_version)]
Name = Annotated[str, StringConstraints(min_length=1), AfterValidator(_normalized)]
RelPath = Annotated[str, AfterValidator(_relative_file)]
MarkerStr = Annotated[str, AfterValidator(_marker)]
SpecifierStr = Annotated[str, AfterValidator(_specifier)]


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class _Hashes(_Model):
    sha256: Sha256


class _File(_Model):
    path: RelPath
    size: int = Field(ge=0)
    hashes: _Hashes


class _Dependency(_Model):
    name: Name


class _Package(_Model):
    name: Name
    version: VersionStr
    marker: MarkerStr | None = None
    dependencies: list[_Dependency] = []
    wheels: list[_File] = []
    sdist: _File | None = None


class _Halo(_Model):
    set: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")]
    python: Annotated[str, StringConstraints(pattern=r"^3\.\d+$")]
    platform: str
    inputs_sha256: Sha256 = Field(alias="inputs-sha256")
    exclude_newer: str = Field(alias="exclude-newer")
    requirements: list[str]
    excluded: list[str]
    allow_prerelease: list[str] = Field(alias="allow-prerelease")
    overrides: list[str]


class _Tool(BaseModel):
    # [tool] belongs to every tool; only halo's table is read (and required) here.
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    halo: _Halo


class _Pylock(_Model):
    lock_version: Literal["1.0"] = Field(alias="lock-version")
    created_by: str = Field(alias="created-by")
    requires_python: SpecifierStr = Field(alias="requires-python")
    environments: list[MarkerStr] = []
    packages: list[_Package]
    tool: _Tool


# --- reading ------------------------------------------------------------------------------


def _file_name_problems(pkg: _Package) -> list[str]:
    """Each file must be a release of its own package: a wheel's name and version say so."""
    from packaging.utils import (
        InvalidSdistFilename,
        InvalidWheelFilename,
        parse_sdist_filename,
        parse_wheel_filename,
    )
    from packaging.version import Version

    out = []
    files = [("wheels", f) for f in pkg.wheels] + ([("sdist", pkg.sdist)] if pkg.sdist else [])
    for key, f in files:
        name = f.path.removeprefix(f"{FILES_DIR}/")
        try:
            if key == "wheels":
                got_name, got_version, _, _ = parse_wheel_filename(name)
            else:
                got_name, got_version = parse_sdist_filename(name)
        except (InvalidWheelFilename, InvalidSdistFilename):
            out.append(f"'{name}' is not a valid {'wheel' if key == 'wheels' else 'sdist'} name")
            continue
        if got_name != pkg.name or got_version != Version(pkg.version):
            out.append(f"'{name}' is not a file of {pkg.name} {pkg.version}")
    if not files:
        out.append("no wheel and no sdist")
    return out


def parse_lock(text: str, origin: str) -> Lock:
    from halo.schema import load_toml, validate

    raw = validate(_Pylock, load_toml(text, origin), origin)
    problems = [
        f"packages[{i}] ({pkg.name}): {p}"
        for i, pkg in enumerate(raw.packages)
        for p in _file_name_problems(pkg)
    ]
    if problems:
        raise HaloError(f"{origin}: {'; '.join(problems)}")
    halo = raw.tool.halo
    packages = tuple(
        Package(
            name=pkg.name,
            version=pkg.version,
            artifacts=tuple(
                Artifact(
                    file=f.path.removeprefix(f"{FILES_DIR}/"), sha256=f.hashes.sha256, size=f.size
                )
                for f in (*pkg.wheels, *([pkg.sdist] if pkg.sdist else []))
            ),
            dependencies=tuple(d.name for d in pkg.dependencies),
            marker=pkg.marker,
        )
        for pkg in raw.packages
    )
    return Lock(
        set=halo.set,
        python=halo.python,
        platform=halo.platform,
        inputs_sha256=halo.inputs_sha256,
        packages=packages,
        extra={
            "exclude-newer": halo.exclude_newer,
            "requirements": list(halo.requirements),
            "excluded": list(halo.excluded),
            "allow-prerelease": list(halo.allow_prerelease),
            "overrides": list(halo.overrides),
        },
        requires_python=raw.requires_python,
        environments=tuple(raw.environments),
    )


def load_lock(path: Path) -> Lock:
    """The lock at ``path``, whose file name must be ``pylock.SET.toml`` for its own set."""
    from halo.schema import read_text

    m = LOCK_NAME_RE.match(path.name)
    if m is None:
        raise HaloError(f"{path}: a lock is named pylock.SET.toml (PEP 751)")
    if not path.is_file():
        raise HaloError(f"{path}: lock not found; run `halo pins lock {m['set']}`")
    lock = parse_lock(read_text(path), str(path))
    if lock.set != m["set"]:
        raise HaloError(
            f"{path}: tool.halo.set: must be '{m['set']}' (the file's name), got '{lock.set}'"
        )
    return lock


# --- writing ------------------------------------------------------------------------------


def _environment(lock: Lock) -> str:
    arch = lock.platform.split("-", 1)[0]
    return (
        f"python_version == '{lock.python}' and sys_platform == 'linux' "
        f"and platform_machine == '{arch}'"
    )


def _file(art: Artifact) -> dict[str, Any]:
    return {"path": art.path, "size": art.size, "hashes": {"sha256": art.sha256}}


def _package(pkg: Package) -> dict[str, Any]:
    out: dict[str, Any] = {"name": normalize(pkg.name), "version": pkg.version}
    if pkg.marker is not None:
        out["marker"] = pkg.marker
    if pkg.dependencies:
        out["dependencies"] = [{"name": normalize(d)} for d in sorted(pkg.dependencies)]
    arts = sorted(pkg.artifacts, key=lambda a: a.file)
    if wheels := [_file(a) for a in arts if a.is_wheel]:
        out["wheels"] = wheels
    if sdists := [_file(a) for a in arts if not a.is_wheel]:
        (out["sdist"],) = sdists  # the standard allows one sdist per package
    return out


def render_lock(lock: Lock, header: str) -> str:
    """The lock as PEP 751 TOML, in a fixed order: the same Lock always gives the same bytes."""
    import tomli_w

    extra = {k: lock.extra.get(k, []) for k in ("requirements", "excluded", "overrides")}
    doc = {
        "lock-version": LOCK_VERSION,
        "created-by": CREATED_BY,
        "requires-python": f"=={lock.python}.*",
        "environments": [_environment(lock)],
        "packages": [_package(p) for p in sorted(lock.packages, key=lambda p: normalize(p.name))],
        "tool": {
            "halo": {
                "set": lock.set,
                "python": lock.python,
                "platform": lock.platform,
                "inputs-sha256": lock.inputs_sha256,
                "exclude-newer": lock.extra.get("exclude-newer", ""),
                "allow-prerelease": list(lock.extra.get("allow-prerelease", [])),  # type: ignore[call-overload]
                **{k: list(v) for k, v in extra.items()},  # type: ignore[call-overload]
            }
        },
    }
    comment = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    return comment + tomli_w.dumps(doc)
