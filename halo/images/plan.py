"""`halo image plan`: what a build would do, computed without Docker.

Everything here comes from the same functions the build uses (input hash, lock, derivation
hashes, the build argv), so the plan cannot drift from the build.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

from halo.errors import HaloError
from halo.images.base import base_ref
from halo.images.build import build_args, labels, resolve_inputs
from halo.images.catalog import Catalog, Image
from halo.images.docker import Builder, Docker, build_argv
from halo.pins.lockfile import Artifact, Lock, load_lock, lock_name, lock_path
from halo.report import human_bytes, table
from halo.store.store import Store

# Wheels are zips: CUDA libraries and torch unpack to about twice their download size. Used
# only for artifacts not in the store yet; stored ones are measured from their zip directory.
UNPACK_FACTOR = 2.0
BASE_ESTIMATE = {"mmdebstrap": 110 << 20, "dockerfile": 330 << 20, "registry": 330 << 20}


@dataclass(frozen=True)
class ArtifactPlan:
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


def artifact_plans(lock: Lock, store: Store) -> list[ArtifactPlan]:
    out = []
    for pkg in lock.packages:
        for art in pkg.artifacts:
            size, exact = installed_size(store, art)
            out.append(ArtifactPlan(pkg.name, pkg.version, art, store.has(art.sha256), size, exact))
    return sorted(out, key=lambda a: -a.installed_bytes)


def derivation_rows(
    repo: Path, catalog: Catalog, image: Image, store: Store, docker: Docker | None
) -> list[tuple[str, ...]]:
    """Per source derivation: where its wheel is (store, cache) or what compiling it costs here."""
    from halo.cache.config import configured_cache
    from halo.images.derivations import derivation_hash, image_derivations
    from halo.images.estimate import CacheProbe, compile_estimate, where

    drvs = image_derivations(repo, catalog, image, docker)
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


def render_plan(
    repo: Path, catalog: Catalog, image: Image, store: Store, docker: Docker | None
) -> str:
    inputs = resolve_inputs(repo, catalog, image, docker)
    lock = load_lock(lock_path(repo / "pins", image.pins))
    base = catalog.bases[image.base]
    arts = artifact_plans(lock, store)
    lines = [f"plan {image.name}: {image.moving_ref} + {image.immutable_ref(inputs.hash)}"]
    pending = str(inputs.parts["base"]).startswith("pending:")
    lines.append(
        f"input hash: {inputs.hash}"
        + (
            "  (provisional: base not made here; its digest replaces the recipe hash once made)"
            if pending
            else ""
        )
    )
    lines.append(
        table(("input", "value"), [(k, _short(v)) for k, v in sorted(inputs.parts.items())])
    )

    lines.append("\nstages:")
    stage_rows = []
    if image.builder or image.sources:
        b = catalog.bases[image.builder or image.base]
        stage_rows.append(
            ("builder", b.name, base_ref(b, repo), f"{b.recipe} from {b.from_ref or b.suite}")
        )
    stage_rows.append(
        (
            "runtime",
            base.name,
            base_ref(base, repo),
            f"{base.recipe} from {base.from_ref or base.suite}",
        )
    )
    lines.append(table(("stage", "base", "ref", "recipe"), stage_rows))

    drv_rows = derivation_rows(repo, catalog, image, store, docker)
    if drv_rows:
        lines.append("\nsource derivations (compiled offline, once per input hash; HALO_BUILDER):")
        lines.append(table(("source", "commit", "cuda arch", "derivation", "wheel"), drv_rows))

    have = sum(a.in_store for a in arts)
    lines.append(
        f"\nartifacts: {len(arts)} from pins/{lock_name(image.pins)}, {have} in the store ({store.root})"
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
    base_bytes = BASE_ESTIMATE[base.recipe]
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

    argv = build_argv(
        Builder("docker", buildx=False),
        Path("<context>"),
        repo.joinpath(image.dockerfile).relative_to(repo),
        [image.immutable_ref(inputs.hash), image.moving_ref],
        build_args(catalog, image, repo),
        labels(image, inputs),
        "none",
        Path("<context>/.iid"),
    )
    lines.append("\nbuild command (after fetch; BuildKit, offline):")
    lines.append("  DOCKER_BUILDKIT=1 " + " ".join(argv))
    return "\n".join(lines)


def _short(value: object) -> str:
    text = str(value)
    return text if len(text) <= 100 else text[:97] + "..."
