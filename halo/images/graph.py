"""The build graph as data: what evaluation produces and realisation walks.

As Nix evaluates an expression for a ``system`` into derivations and then realises them,
`halo image build` is two phases. Evaluation (halo.images.evaluate) is a pure function of the
repository's files and a target platform; it returns a ``Plan``: every node the image needs,
each with its inputs and their hash, in dependency order. Realisation (halo.images.realise)
walks those nodes: fetch, make base, realise derivations, build or assemble the image.

This module is the interface between the two: types and constants only, importing neither
phase. The platform is an input of the plan, never a property of the host: a plan for
linux/arm64 made on an amd64 machine is the same as one made on an arm64 machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from halo.errors import HaloError
from halo.images.catalog_types import Base, Image

if TYPE_CHECKING:
    from halo.builder.toolchain import Toolchain
    from halo.pins.deblock import DebInputs
    from halo.pins.source_pins import SourcePin

# Timestamps inside made bases and images (file mtimes, the config's `created`).
DEFAULT_EPOCH = 1793491200  # 2026-11-01T00:00:00Z
BASE_LABEL = "io.halo.base-recipe"  # the full recipe hash, in a made base's config
INPUT_LABEL = "io.halo.input-hash"  # the full input hash, in a built image's config
LABEL_PREFIX = "org.opencontainers.image"
# Paths every build step mounts something on; a made base carries them, empty.
MOUNT_POINTS = ("dev/", "etc/hostname", "etc/hosts", "etc/resolv.conf")
# The installer that lays out an assembled image's Python environment, by version: another
# uv may lay files out differently, so it is an input of the image (and checked when used).
UV_VERSION = "0.13.9"


@dataclass(frozen=True)
class Inputs:
    """What went into an image, by content. ``hash`` is the image's address."""

    parts: dict[str, object]

    @property
    def hash(self) -> str:
        from halo.hashing import sha256_json

        return sha256_json(self.parts)


def source_date_epoch() -> int:
    return int(os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_EPOCH))


@dataclass(frozen=True)
class Platform:
    """An OCI platform (``linux/arm64``). amd64 is the one whose names carry no suffix: its
    locks, bases and tags are named as they were before there was a second platform."""

    os: str
    arch: str

    def __str__(self) -> str:
        return f"{self.os}/{self.arch}"

    @property
    def machine(self) -> str:
        """uname -m, and the first word of a uv target (``aarch64-manylinux_2_36``)."""
        return MACHINES[self.arch]

    @property
    def deb_arch(self) -> str:
        return self.arch  # Debian's names are OCI's for these two

    @property
    def suffix(self) -> str:
        """What a lock's, a base's or a tag's name gains for this platform."""
        return "" if self == AMD64 else f"-{self.arch}"

    def uv_target(self, glibc: str) -> str:
        """uv's --python-platform for a Debian base with ``glibc`` (``2_36``)."""
        return f"{self.machine}-manylinux_{glibc}"


MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}
AMD64 = Platform("linux", "amd64")
ARM64 = Platform("linux", "arm64")
PLATFORMS = (AMD64, ARM64)


def parse_platform(text: str) -> Platform:
    """``linux/amd64`` or ``linux/arm64`` (``amd64``/``arm64`` alone mean linux); else one error
    line naming what is known."""
    value = text.strip().lower()
    if "/" not in value:
        value = f"linux/{value}"
    for p in PLATFORMS:
        if value == str(p):
            return p
    known = ", ".join(str(p) for p in PLATFORMS)
    raise HaloError(f"--platform {text}: unknown platform (known: {known})")


def set_for(set_name: str, platform: Platform) -> str:
    """The pin set whose lock serves ``set_name`` on ``platform`` (cpu -> cpu-arm64)."""
    return set_name + platform.suffix


def base_lock_name(base: str, platform: Platform) -> str:
    """The name a base's OS lock is kept under (debian12-python -> debian12-python-arm64)."""
    return base + platform.suffix


@dataclass(frozen=True)
class FetchDebs:
    """A base's .debs into the store: a fixed-output fetch by the OS lock's sha256s."""

    id: str
    base: str
    platform: Platform
    lock: str  # the OS lock, relative to the repository
    lock_sha256: str
    inputs: DebInputs  # what the OS lock must answer (checked before anything is made)
    deps: tuple[str, ...] = ()
    kind: str = "fetch-debs"


@dataclass(frozen=True)
class MakeBase:
    """A Debian base made offline by mmdebstrap from the store: addressed by its recipe hash."""

    id: str
    base: Base
    platform: Platform
    recipe: str  # the full recipe hash (halo.images.evaluate.bases.recipe_hash)
    ref: str  # halo-base/NAME[-arm64]:RECIPE12
    deps: tuple[str, ...]
    kind: str = "base"


@dataclass(frozen=True)
class FetchWheels:
    """A lock's artifacts into the store: a fixed-output fetch by the lock's sha256s."""

    id: str
    set: str  # the pin set of the lock (cpu, cpu-arm64)
    platform: Platform
    lock: str
    lock_sha256: str
    deps: tuple[str, ...] = ()
    kind: str = "fetch-wheels"


@dataclass(frozen=True)
class DerivationNode:
    """A source build: a wheel addressed by the hash of exactly ``inputs``."""

    id: str
    pin: SourcePin
    toolchain: Toolchain
    env: tuple[tuple[str, str], ...]
    patches: tuple[tuple[str, str], ...]  # (patch name, fingerprint) of patches/sources/ applied
    inputs: dict[str, object]
    hash: str
    platform: Platform
    deps: tuple[str, ...]
    kind: str = "derivation"

    @property
    def name(self) -> str:
        return self.pin.name


@dataclass(frozen=True)
class ImageNode:
    """The image: its input hash, and how it is realised.

    ``method`` is ``dockerfile`` (BuildKit runs the Dockerfile on the build host, whose
    platform it must be) or ``assemble`` (the layers are made on the build host for the target
    platform, uv installing for it; no step runs under emulation).
    """

    id: str
    image: Image
    platform: Platform
    inputs: dict[str, object]
    hash: str
    method: str
    base: str  # the runtime MakeBase node
    builder: str | None  # the builder MakeBase node, if the image compiles anything
    lock: str  # the FetchWheels node of the image's lock
    derivations: tuple[str, ...]
    build_args: dict[str, str]  # the Dockerfile's build arguments (BASE by reference)
    labels: dict[str, str]
    deps: tuple[str, ...]
    kind: str = "image"

    @property
    def immutable_ref(self) -> str:
        return self.image.immutable_ref(self.hash)

    @property
    def moving_ref(self) -> str:
        """The moving tag here: amd64's is the catalog's; another platform's carries its name
        (one engine tag holds one platform; the registry's index holds both under one)."""
        return self.image.moving_ref + self.platform.suffix


Node = FetchDebs | MakeBase | FetchWheels | DerivationNode | ImageNode


@dataclass(frozen=True)
class Plan:
    """Every node one image needs on one platform, dependencies first."""

    image: Image
    platform: Platform
    nodes: tuple[Node, ...]
    by_id: dict[str, Node] = field(repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_id", {n.id: n for n in self.nodes})

    def node(self, node_id: str) -> Node:
        return self.by_id[node_id]

    @property
    def target(self) -> ImageNode:
        last = self.nodes[-1]
        assert isinstance(last, ImageNode)
        return last

    @property
    def input_hash(self) -> str:
        return self.target.hash

    def bases(self) -> list[MakeBase]:
        return [n for n in self.nodes if isinstance(n, MakeBase)]

    def derivations(self) -> list[DerivationNode]:
        return [n for n in self.nodes if isinstance(n, DerivationNode)]
