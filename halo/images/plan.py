"""`halo image plan`: what a build would do, computed without Docker (used when it answers).

The plan is the build's own (halo.images.buildplan): `--json` prints it, the text below is
rendered from it, and `halo image build` runs exactly its command.
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from halo.errors import HaloError
from halo.images.buildplan import BuildPlan, evaluate, make_plan
from halo.images.catalog import Catalog, Image
from halo.images.docker import Builder, Docker
from halo.pins.lockfile import Artifact, Lock, load_lock, lock_path
from halo.report import human_bytes, table
from halo.store.store import Store

if TYPE_CHECKING:
    from halo.images.derivations import Derivation

# Wheels are zips: CUDA libraries and torch unpack to about twice their download size. Used
# only for artifacts not in the store yet; stored ones are measured from their zip directory.
UNPACK_FACTOR = 2.0
# A base unpacks to about three times its locked .debs (measured: 53 MB of .debs, a 171 MB
# debian12-python; 118 MB, a 411 MB debian12-gpu).
DEB_UNPACK_FACTOR = 3.3


@dataclass(frozen=True)
class ArtifactSize:
    package: str
    version: str
    artifact: Artifact
    in_store: bool
    installed_bytes: int
    exact: bool


def installed_size(store: Store, art: Artifact) -> tuple[int, bool]:
    path = store.path(art.sha256)
    if path.is_file() and art.is_wheel:
        with zipfile.ZipFile(path) as zf:
            return sum(i.file_size for i in zf.infolist()), True
    return int((art.size or 0) * UNPACK_FACTOR), False


def artifact_sizes(lock: Lock, store: Store) -> list[ArtifactSize]:
    out = []
    for pkg in lock.packages:
        for art in pkg.artifacts:
            size, exact = installed_size(store, art)
            out.append(ArtifactSize(pkg.name, pkg.version, art, store.has(art.sha256), size, exact))
    return sorted(out, key=lambda a: -a.installed_bytes)


def derivation_rows(
    repo: Path,
    catalog: Catalog,
    image: Image,
    store: Store,
    docker: Docker | None,
    drvs: Sequence[Derivation] | None = None,
) -> list[tuple[str, ...]]:
    """Per source derivation: where its wheel is (store, cache) or what compiling it costs here."""
    from halo.cache.config import configured_cache
    from halo.images.derivations import derivation_hash, image_derivations
    from halo.images.estimate import CacheProbe, compile_estimate, where

    if drvs is None:
        drvs = image_derivations(repo, catalog, image)
    cache = CacheProbe(configured_cache() if drvs else None)
    rows = []
    for drv in drvs:
        h = derivation_hash(drv, repo)
        rows.append(
            (
                drv.name,
                drv.pin.commit[:12],
                dict(drv.env)["TORCH_CUDA_ARCH_LIST"],
                f"{drv.toolchain.kind} {h[:12]}",
                where(h, store, cache) or compile_estimate(drv, store),
            )
        )
    if cache.problem:
        rows.append(("(cache)", "", "", "", f"not consulted: {cache.problem}"))
    return rows


def local_docker() -> Docker | None:
    """The engine, when one answers: made bases then enter the plan by their real digests."""
    try:
        docker = Docker.discover()
        docker.ping()
    except HaloError:
        return None
    return docker


def image_plan(
    repo: Path, catalog: Catalog, image: Image, store: Store, docker: Docker | None
) -> BuildPlan:
    """The plan `halo image build` would make and run here (the engine's builder when it
    answers; else the built-in BuildKit's `docker build`)."""
    ev = evaluate(repo, catalog, image, docker)
    lock = load_lock(lock_path(repo / "pins", image.pins))
    return make_plan(repo, catalog, ev, lock, store, plan_builder(docker))


def plan_builder(docker: Docker | None) -> Builder:
    """The engine's builder; where there is none usable (no engine, or a CLI without buildx),
    the built-in BuildKit's `docker build`: a plan is made on any host, a build says why not."""
    if docker is not None:
        try:
            return docker.builder
        except HaloError:
            pass
    return Builder("docker", buildx=False)


def render_plan(
    repo: Path, catalog: Catalog, plan: BuildPlan, store: Store, docker: Docker | None
) -> str:
    image = plan.evaluation.image
    base = catalog.bases[image.base]
    arts = artifact_sizes(plan.lock_data, store)
    lines = [f"plan {plan.image}: {plan.moving_ref} + {plan.immutable_ref}"]
    lines.append(f"input hash: {plan.input_hash}")
    lines.append(
        table(("input", "value"), [(k, _short(v)) for k, v in sorted(plan.inputs.items())])
    )

    lines.append("\nstages:")
    lines.append(
        table(
            ("stage", "base", "ref", "recipe"),
            [(s.stage, s.base, s.ref, s.recipe) for s in plan.stages],
        )
    )

    drvs = plan.evaluation.derivations
    drv_rows = derivation_rows(repo, catalog, image, store, docker, drvs) if drvs else []
    if drv_rows:
        lines.append(
            "\nsource derivations (compiled offline, once per derivation hash; HALO_BUILDER):"
        )
        lines.append(table(("source", "commit", "cuda arch", "derivation", "wheel"), drv_rows))

    have = sum(a.in_store for a in plan.artifacts)
    lines.append(
        f"\nartifacts: {len(plan.artifacts)} from {plan.lock}, {have} in the store ({store.root})"
    )
    lines.append(
        table(
            ("package", "version", "download", "installed", "in store"),
            [
                (
                    a.package,
                    a.version,
                    human_bytes(a.artifact.size or 0),
                    human_bytes(a.installed_bytes) + ("" if a.exact else " est."),
                    "yes" if a.in_store else "no",
                )
                for a in arts
            ],
        )
    )

    stack = sum(a.installed_bytes for a in arts)
    from halo.images.base import os_lock_file
    from halo.pins.deblock import load_deb_lock

    base_bytes = int(load_deb_lock(os_lock_file(base, repo)).total_size * DEB_UNPACK_FACTOR)
    halo_bytes = sum(p.stat().st_size for p in (repo / "halo").rglob("*.py"))
    kernels = 0 if not drv_rows else 600 << 20
    layers = [
        ("base", base.name, base_bytes),
        ("1 locked stack", f"{len(arts)} wheels", stack),
        ("2 kernels", f"{len(drv_rows)} derivations", kernels),
        ("3 halo + patches + build record", "halo wheel", halo_bytes),
    ]
    total = sum(b for *_, b in layers)
    lines.append("\nestimated uncompressed size by layer:")
    lines.append(
        table(
            ("layer", "what", "size"),
            [(n, w, human_bytes(b)) for n, w, b in layers] + [("total", "", human_bytes(total))],
        )
    )
    biggest = ", ".join(f"{a.package} {human_bytes(a.installed_bytes)}" for a in arts[:5])
    lines.append(f"dominated by: {biggest}")

    lines.append("\nbuild command (after fetch; BuildKit, offline; in the repository):")
    lines.append("  " + plan.command.shell())
    return "\n".join(lines)


def _short(value: object) -> str:
    text = str(value)
    return text if len(text) <= 100 else text[:97] + "..."
