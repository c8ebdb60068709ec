"""The CycloneDX SBOM of an image's Python environment, made from what the image is made of.

Written on the host with cyclonedx-python-lib when the build context is staged
(halo.images.context), from the inputs by content: every package of the lock with its purl,
version and the sha256 of the one file the lock installs; the kernels' wheels (derivations)
and halo's own wheel with theirs; the dependency graph of the lock (each package's direct
dependencies, the image depending on the roots); the image's input hash as a property. It is
validated against the CycloneDX JSON schema before it is written. No wall-clock time: the
serial number comes from the input hash and the timestamp is the fixed SOURCE_DATE_EPOCH, so
the same inputs give the same bytes. In the image, `halo image stamp` checks it against the
installed distributions (``check_installed``) and puts it at /etc/halo/sbom.cdx.json.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name

from halo import __version__
from halo.errors import HaloError

if TYPE_CHECKING:
    from cyclonedx.model.bom import Bom

    from halo.pins.lockfile import Lock

SCHEMA = "1.6"
INPUT_HASH_PROPERTY = "halo:input-hash"
SBOM_FILE = "sbom.cdx.json"  # staged next to build-inputs.json in the context's halo/


@dataclass(frozen=True)
class Part:
    """One distribution in the image: the file it was installed from, by content."""

    name: str
    version: str
    file: str
    sha256: str
    dependencies: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return canonicalize_name(self.name)


def lock_parts(lock: Lock) -> list[Part]:
    """A part per locked package: the one file the lock installs for its target."""
    out = []
    for pkg in lock.packages:
        if len(pkg.artifacts) != 1:
            raise HaloError(
                f"pins/pylock.{lock.set}.toml: {pkg.name}: expected the one file the target "
                f"installs, found {len(pkg.artifacts)}"
            )
        (art,) = pkg.artifacts
        out.append(Part(pkg.name, pkg.version, art.file, art.sha256, tuple(pkg.dependencies)))
    return out


def wheel_part(file: str, sha256: str) -> Part:
    """A wheel outside the lock (a kernel derivation, halo's own), named by its file."""
    from packaging.utils import parse_wheel_filename

    name, version, _, _ = parse_wheel_filename(file)
    return Part(name, str(version), file, sha256)


def build_bom(image_ref: str, input_hash: str, pin_set: str, parts: Sequence[Part]) -> Bom:
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.model.component import Component, ComponentType
    from packageurl import PackageURL

    from halo.images.graph import DEFAULT_EPOCH

    keys = [p.key for p in parts]
    if dup := sorted({k for k in keys if keys.count(k) > 1}):
        raise HaloError(f"SBOM of {image_ref}: {dup[0]} is in the image twice")
    components: dict[str, Component] = {}
    for part in sorted(parts, key=lambda p: p.key):
        purl = PackageURL(
            type="pypi", name=part.key, version=part.version, qualifiers={"file_name": part.file}
        )
        components[part.key] = Component(
            type=ComponentType.LIBRARY,
            name=part.name,
            version=part.version,
            purl=purl,
            bom_ref=purl.to_string(),
            hashes=[HashType(alg=HashAlgorithm.SHA_256, content=part.sha256)],
        )
    image = Component(
        type=ComponentType.CONTAINER, name=image_ref, version=input_hash, bom_ref=image_ref
    )
    tool = Component(type=ComponentType.APPLICATION, name="halo", version=__version__)
    bom = Bom(
        # Derived from the input hash, so the same inputs give the same document.
        serial_number=uuid.UUID(input_hash[:32]),
        metadata=BomMetaData(
            component=image,
            timestamp=datetime.datetime.fromtimestamp(DEFAULT_EPOCH, datetime.UTC),
            properties=[
                Property(name=INPUT_HASH_PROPERTY, value=input_hash),
                Property(name="halo:pin-set", value=pin_set),
            ],
        ),
        components=components.values(),
    )
    bom.metadata.tools.components.add(tool)
    depended: set[str] = set()
    for part in parts:
        missing = [d for d in part.dependencies if canonicalize_name(d) not in components]
        if missing:
            raise HaloError(f"SBOM of {image_ref}: {part.name} depends on {missing[0]}, not locked")
        deps = {canonicalize_name(d) for d in part.dependencies}
        depended |= deps
        bom.register_dependency(components[part.key], [components[d] for d in sorted(deps)])
    roots = [components[k] for k in sorted(components) if k not in depended]
    bom.register_dependency(image, roots)
    return bom


def render(bom: Bom) -> str:
    """The SBOM as CycloneDX JSON, validated against the schema the library ships."""
    from cyclonedx.output import make_outputter
    from cyclonedx.schema import OutputFormat, SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    version = SchemaVersion.from_version(SCHEMA)
    text = make_outputter(bom, OutputFormat.JSON, version).output_as_string(indent=2)
    if error := JsonStrictValidator(version).validate_str(text):
        raise HaloError(f"SBOM: not valid CycloneDX {SCHEMA}: {error}")
    return text + "\n"


def image_sbom(
    lock: Lock, image_ref: str, input_hash: str, wheels: Iterable[tuple[str, str]]
) -> str:
    """The image's SBOM: the lock's packages plus ``wheels`` (file name, sha256)."""
    try:
        import cyclonedx  # noqa: F401 - the toolchain extra's, not one of halo's dependencies
    except ModuleNotFoundError:
        raise HaloError(
            "the image's SBOM is written with cyclonedx-python-lib, which is not installed: "
            "install the toolchain (`nox -s dev`, or the `toolchain` extra)"
        ) from None
    parts = lock_parts(lock) + [wheel_part(f, sha) for f, sha in wheels]
    return render(build_bom(image_ref, input_hash, lock.set, parts))


# --- in the image -------------------------------------------------------------------------


def check_installed(doc: Mapping[str, object], installed: Mapping[str, str]) -> None:
    """The SBOM names exactly the installed distributions (name -> version), at their versions."""
    listed = {
        canonicalize_name(str(c["name"])): str(c["version"])
        for c in doc.get("components", [])  # type: ignore[attr-defined]
    }
    have = {canonicalize_name(n): v for n, v in installed.items()}
    problems = [
        f"{n} {v} is installed but the SBOM says {listed.get(n, 'nothing')}"
        for n, v in sorted(have.items())
        if listed.get(n) != v
    ]
    problems += [
        f"{n} {v} is in the SBOM, not installed" for n, v in sorted(listed.items()) if n not in have
    ]
    if problems:
        raise HaloError(f"SBOM: does not describe this environment: {'; '.join(problems[:5])}")


def installed_distributions(site: Path | None = None) -> dict[str, str]:
    """name -> version of what this interpreter (or the site-packages ``site``) has installed."""
    from importlib import metadata

    found = metadata.distributions(path=[str(site)]) if site else metadata.distributions()
    return {d.metadata["Name"]: d.version for d in found if d.metadata["Name"]}
