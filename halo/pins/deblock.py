"""The OS lock of a made base: `pins/debian.BASE.lock.toml`, every .deb of its closure.

One file per mmdebstrap base of images/images.yaml. Its `[base]` table holds the inputs the
closure was resolved for (suite, variant, architecture, component, packages) and the
archive's Essential set at that time; each `[[package]]` is one .deb as the archive's
`Packages` index (verified by apt against the signed Release) describes it: name, version,
architecture, the archive-relative `filename` (pool/…), size, sha256, and the relation
fields the closure check needs. No host name: where the pool lives is configuration
(halo.sources.debian_mirror).

The invariants are pure (`check_deb_lock`): one version per name, the Essential set and the
requested packages present, every Depends/Pre-Depends satisfied inside the lock, sha256 and
filename well-formed. Same DebLock in, same bytes out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from halo.errors import HaloError
from halo.hashing import sha256_json
from halo.pins.debversion import parse_relations, satisfies

LOCK_VERSION = 1
DEB_NAME_RE = re.compile(r"[a-z0-9][a-z0-9+.-]+")
POOL_RE = re.compile(r"pool/[A-Za-z0-9+._/~%-]+\.deb")


def deb_lock_name(base: str) -> str:
    return f"debian.{base}.lock.toml"


def deb_lock_path(pins_dir: Path, base: str) -> Path:
    return pins_dir / deb_lock_name(base)


@dataclass(frozen=True)
class DebInputs:
    """What a base's closure is resolved for: the catalog entry's recipe, nothing else."""

    base: str
    suite: str
    variant: str
    packages: tuple[str, ...]
    architecture: str = "amd64"
    component: str = "main"

    @property
    def sha256(self) -> str:
        return sha256_json(
            {
                "suite": self.suite,
                "variant": self.variant,
                "packages": sorted(self.packages),
                "architecture": self.architecture,
                "component": self.component,
            }
        )


@dataclass(frozen=True)
class Deb:
    name: str
    version: str
    architecture: str
    filename: str
    size: int
    sha256: str
    depends: str = ""
    pre_depends: str = ""
    provides: str = ""
    essential: bool = False

    @property
    def file(self) -> str:
        """The .deb's file name (the last part of its pool path): what a flat repository holds."""
        return self.filename.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class DebLock:
    inputs: DebInputs
    essential: tuple[str, ...]  # the archive's Essential: yes packages when resolved
    debs: tuple[Deb, ...]
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def total_size(self) -> int:
        return sum(d.size for d in self.debs)


# -- reading and writing ------------------------------------------------------------------

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
DebName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9+.-]+$")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _BaseModel(_Model):
    name: str
    suite: str
    variant: str
    architecture: str
    component: str
    packages: list[DebName]
    essential: list[DebName]
    inputs_sha256: Sha256


class _DebModel(_Model):
    name: DebName
    version: Annotated[str, Field(min_length=1)]
    architecture: str
    filename: Annotated[str, StringConstraints(pattern=POOL_RE.pattern)]
    size: Annotated[int, Field(gt=0)]
    sha256: Sha256
    depends: str = ""
    pre_depends: str = ""
    provides: str = ""
    essential: bool = False


class _LockModel(_Model):
    lock_version: int
    base: _BaseModel
    package: list[_DebModel] = Field(default_factory=list)


def parse_deb_lock(text: str, origin: str) -> DebLock:
    from halo.schema import load_toml, validate

    doc = validate(_LockModel, load_toml(text, origin), origin)
    if doc.lock_version != LOCK_VERSION:
        raise HaloError(f"{origin}: lock_version: expected {LOCK_VERSION}, got {doc.lock_version}")
    b = doc.base
    inputs = DebInputs(b.name, b.suite, b.variant, tuple(b.packages), b.architecture, b.component)
    debs = tuple(Deb(**d.model_dump()) for d in doc.package)
    return DebLock(inputs, tuple(b.essential), debs, {"inputs_sha256": b.inputs_sha256})


def load_deb_lock(path: Path) -> DebLock:
    from halo.schema import read_text

    return parse_deb_lock(read_text(path), str(path))


def render_deb_lock(lock: DebLock) -> str:
    import tomli_w

    i = lock.inputs
    doc = {
        "lock_version": LOCK_VERSION,
        "base": {
            "name": i.base,
            "suite": i.suite,
            "variant": i.variant,
            "architecture": i.architecture,
            "component": i.component,
            "packages": sorted(i.packages),
            "essential": sorted(lock.essential),
            "inputs_sha256": i.sha256,
        },
        "package": [
            {
                k: v
                for k, v in (
                    ("name", d.name),
                    ("version", d.version),
                    ("architecture", d.architecture),
                    ("filename", d.filename),
                    ("size", d.size),
                    ("sha256", d.sha256),
                    ("depends", d.depends),
                    ("pre_depends", d.pre_depends),
                    ("provides", d.provides),
                    ("essential", d.essential),
                )
                if v != "" and v is not False
            }
            for d in sorted(lock.debs, key=lambda d: (d.name, d.architecture))
        ],
    }
    head = (
        f"# The Debian packages of base {i.base}: generated by `halo pins lock --os {i.base}`; "
        "do not edit.\n# Each .deb as the archive's signed index lists it; fetched by sha256 "
        "(`halo fetch`), made offline (`halo image base`).\n"
    )
    return head + tomli_w.dumps(doc)


# -- invariants ---------------------------------------------------------------------------


def _provided(lock: DebLock) -> dict[str, list[tuple[str, str]]]:
    """name -> [(version or "" for an unversioned Provides, providing package)]."""
    out: dict[str, list[tuple[str, str]]] = {}
    for d in lock.debs:
        out.setdefault(d.name, []).append((d.version, d.name))
        for group in parse_relations(d.provides):
            for rel in group:
                out.setdefault(rel.name, []).append((rel.version, d.name))
    return out


def unmet(lock: DebLock) -> list[tuple[str, str, str]]:
    """(package, field, relation group) for every Depends/Pre-Depends the lock does not meet."""
    have = _provided(lock)
    missing = []
    for d in lock.debs:
        for label, value in (("Pre-Depends", d.pre_depends), ("Depends", d.depends)):
            for group in parse_relations(value):
                if not any(
                    (v and satisfies(v, rel.op, rel.version)) if rel.op else True
                    for rel in group
                    for v, _ in have.get(rel.name, [])
                ):
                    missing.append((d.name, label, " | ".join(str(r) for r in group)))
    return missing


def check_deb_lock(lock: DebLock, where: str, wanted: DebInputs | None = None) -> list[str]:
    """Every broken invariant of ``lock`` as one line ``WHERE: PACKAGE: RULE (hint)``.

    With ``wanted`` (the catalog's recipe), a lock resolved for other inputs is one more line.
    """
    out: list[str] = []
    names: dict[str, list[str]] = {}
    for d in lock.debs:
        names.setdefault(d.name, []).append(d.version)
        if not re.fullmatch(r"[0-9a-f]{64}", d.sha256):
            out.append(f"{where}: {d.name}: sha256 (not 64 lowercase hex digits: {d.sha256!r})")
        if not POOL_RE.fullmatch(d.filename) or not d.file.startswith(f"{d.name}_"):
            out.append(f"{where}: {d.name}: filename (not a pool/… path of it: {d.filename!r})")
        if d.architecture not in ("all", lock.inputs.architecture):
            out.append(
                f"{where}: {d.name}: architecture ({d.architecture} in an {lock.inputs.architecture} base)"
            )
    for name, versions in sorted(names.items()):
        if len(versions) > 1:
            out.append(f"{where}: {name}: one-version (locked as {', '.join(versions)})")
    for name in sorted(set(lock.essential) - set(names)):
        out.append(f"{where}: {name}: essential (the archive's Essential set must be installed)")
    for name in sorted(set(lock.inputs.packages) - set(names)):
        out.append(f"{where}: {name}: requested (listed in the base's packages, not locked)")
    try:
        for pkg, label, group in unmet(lock):
            out.append(f"{where}: {pkg}: closure ({label} {group} not in the lock)")
    except ValueError as exc:
        out.append(f"{where}: relations: {exc}")
    recorded = lock.extra.get("inputs_sha256")
    if recorded is not None and recorded != lock.inputs.sha256:
        out.append(
            f"{where}: base: inputs_sha256 (does not match the [base] table: edited by hand?)"
        )
    if wanted is not None and wanted.sha256 != lock.inputs.sha256:
        out.append(
            f"{where}: base: inputs (catalog asks {wanted.suite}/{wanted.variant} "
            f"+{','.join(sorted(wanted.packages))}; run `halo pins lock --os {wanted.base}`)"
        )
    return out


def cpython_of(lock: DebLock) -> str | None:
    """The CPython (``3.11``) a base's OS lock ships: its ``python3.X`` package, or None."""
    found = sorted(m.group(1) for d in lock.debs if (m := re.fullmatch(r"python(3\.\d+)", d.name)))
    return found[-1] if found else None
