"""Source pins (pins/sources.toml): what the index does not publish, pinned by commit and content.

Each pin is a derivation's inputs: repository, exact commit, a content hash of the source
tree, the sets that build it and the build knobs. Whether commit and hash are well formed is
an invariant (halo.pins.invariants), so a missing hash is reported with the other rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import Field

from halo.pins.lockfile import normalize
from halo.schema import Name, Problems, RelativePath, Strict, load_toml, matches, read_text

SOURCES_FILE = "sources.toml"
PackageName = Annotated[
    str, matches(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", "a distribution name")
]


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
    probe: str = ""  # the source the first-object probe compiles ("": ninja's first)
    probe_defines: tuple[str, ...] = ()  # macros the probe's one compile defines

    @property
    def key(self) -> str:
        """The name invariants compare against lock packages (the built distribution)."""
        return normalize(self.distribution)


class SubmoduleSpec(Strict):
    path: RelativePath
    repository: Annotated[str, Field(min_length=1)]
    commit: str = ""
    content_sha256: str = Field("", alias="content-sha256")
    subdirectory: RelativePath | None = None


class SourcePinSpec(Strict):
    distribution: PackageName
    version: Annotated[str, Field(min_length=1)]
    repository: Annotated[str, Field(min_length=1)]
    # Missing or malformed commit/hash are reported by the source-pinned invariant.
    commit: str = ""
    content_sha256: str = Field("", alias="content-sha256")
    sets: Annotated[list[Name], Field(min_length=1)]
    subdirectory: RelativePath | None = None
    cuda_arch: dict[Name, str] = Field(default_factory=dict, alias="cuda-arch")
    env: dict[
        Annotated[str, matches(r"[A-Za-z_][A-Za-z0-9_]*", "an environment variable name")], str
    ] = Field(default_factory=dict)
    submodule: list[SubmoduleSpec] = Field(default_factory=list)
    # The one CUDA source that `halo image kernels --first-object` compiles (a path in the
    # tree, under `subdirectory`), instead of whichever one the build's ninja schedules first.
    # Not an input of the derivation's hash: the wheel's build compiles every source.
    probe: RelativePath | None = None
    # Macros that compile alone defines (-D): the source's own switches for fewer template
    # instances, so the probe proves the toolchain in a minute, not several. Not hashed either.
    probe_defines: list[Annotated[str, matches(r"[A-Za-z_][A-Za-z0-9_]*", "a C macro name")]] = (
        Field(default_factory=list, alias="probe-defines")
    )


class SourcesFile(Strict):
    source: dict[Name, object] = Field(default_factory=dict)


def parse_source_pins(text: str, origin: str) -> tuple[SourcePin, ...]:
    """pins/sources.toml, every problem reported at once by key path (``source.x.sets: ...``)."""
    found = Problems(origin)
    top = found.model(SourcesFile, load_toml(text, origin))
    found.check()
    assert top is not None
    pins = []
    for name, raw in top.source.items():
        spec = found.model(SourcePinSpec, raw, f"source.{name}")
        if spec is None:
            continue
        pins.append(
            SourcePin(
                name=name,
                distribution=spec.distribution,
                version=spec.version,
                repository=spec.repository,
                commit=spec.commit,
                content_sha256=spec.content_sha256,
                sets=tuple(spec.sets),
                subdirectory=spec.subdirectory or "",
                cuda_arch=dict(sorted(spec.cuda_arch.items())),
                env=dict(sorted(spec.env.items())),
                submodules=tuple(
                    Submodule(
                        path=m.path,
                        repository=m.repository,
                        commit=m.commit,
                        content_sha256=m.content_sha256,
                        subdirectory=m.subdirectory or "",
                    )
                    for m in spec.submodule
                ),
                probe=spec.probe or "",
                probe_defines=tuple(spec.probe_defines),
            )
        )
    found.check()
    return tuple(pins)


def load_source_pins(pins_dir: Path) -> tuple[SourcePin, ...]:
    path = pins_dir / SOURCES_FILE
    if not path.is_file():
        return ()
    return parse_source_pins(read_text(path), str(path))
