"""`halo image plan`: what a build would do, shown from its evaluated plan.

The plan itself (halo.images.evaluate.plan) is a pure function of the checkout and the
platform; `--json` prints it as "graph", with the inputs and their hash. Around it this view
puts what realising it here involves (the context, the exact build command for this host's
builder) and, where they answer, what this machine already has: bases made in the engine,
artifacts and derivation wheels in the store. Those observations are marked as such; the
hashes never depend on them.
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from halo.errors import HaloError
from halo.images.catalog import Catalog, Image
from halo.images.docker import Builder, Docker
from halo.images.evaluate.plan import evaluate, plan_dict
from halo.images.graph import AMD64, ImageNode, MakeBase, Plan, Platform
from halo.pins.lockfile import Artifact, Lock, load_lock
from halo.report import human_bytes, table
from halo.store.store import Store

if TYPE_CHECKING:
    from halo.images.graph import DerivationNode

# Wheels are zips: CUDA libraries and torch unpack to about twice their download size. Used
# only for artifacts not in the store yet; stored ones are measured from their zip directory.
UNPACK_FACTOR = 2.0
# A base unpacks to about three times its locked .debs (measured: 53 MB of .debs, a 171 MB
# debian12-python; 118 MB, a 411 MB debian12-gpu).
DEB_UNPACK_FACTOR = 3.3


@dataclass(frozen=True)
class Stage:
    stage: str  # builder | runtime
    base: str
    ref: str
    recipe: str
    image_id: str | None  # observed: None when not made here (or no engine answered)


@dataclass(frozen=True)
class DerivationPlan:
    name: str
    commit: str
    hash: str
    toolchain: str
    in_store: bool  # observed: its record and wheel are in the store, nothing to compile


@dataclass(frozen=True)
class ArtifactPlan:
    package: str
    version: str
    file: str
    sha256: str
    size: int | None
    in_store: bool  # observed


@dataclass(frozen=True)
class Command:
    """One process the build runs, exactly: argv, run in cwd with env added to the caller's."""

    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]

    def shell(self) -> str:
        return " ".join([*(f"{k}={v}" for k, v in sorted(self.env.items())), *self.argv])


@dataclass(frozen=True)
class BuildPlan:
    image: str
    platform: str
    moving_ref: str
    immutable_ref: str
    input_hash: str
    inputs: dict[str, object]
    stages: tuple[Stage, ...]
    derivations: tuple[DerivationPlan, ...]
    lock: str  # the lock file, relative to the repository
    artifacts: tuple[ArtifactPlan, ...]
    context: str
    iidfile: str  # outside the context: writing into the context would change it
    command: Command
    graph: dict[str, object]  # the evaluated plan: every node, its inputs' hash, its deps
    # What the view is made from; not part of the printed plan.
    evaluation: Plan = field(repr=False, compare=False, metadata={"data": False})
    lock_data: Lock = field(repr=False, compare=False, metadata={"data": False})

    def to_dict(self) -> dict[str, object]:
        def data(value: object) -> object:
            if isinstance(value, tuple):
                return [data(v) for v in value]
            return asdict(value) if is_dataclass(value) else value  # type: ignore[arg-type]

        return {
            f.name: data(getattr(self, f.name))
            for f in fields(self)
            if f.metadata.get("data", True)
        }


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
    drvs: Sequence[DerivationNode] | None = None,
) -> list[tuple[str, ...]]:
    """Per source derivation: where its wheel is (store, cache) or what compiling it costs here."""
    from halo.cache.config import configured_cache
    from halo.images.estimate import CacheProbe, compile_estimate, where
    from halo.images.evaluate.derivations import derivation_node, image_derivations

    nodes = (
        list(drvs)
        if drvs is not None
        else [derivation_node(d, repo) for d in image_derivations(repo, catalog, image)]
    )
    cache = CacheProbe(configured_cache() if nodes else None)
    rows = []
    for node in nodes:
        rows.append(
            (
                node.name,
                node.pin.commit[:12],
                dict(node.env)["TORCH_CUDA_ARCH_LIST"],
                f"{node.toolchain.kind} {node.hash[:12]}",
                where(node.hash, store, cache) or compile_estimate(node, store),
            )
        )
    if cache.problem:
        rows.append(("(cache)", "", "", "", f"not consulted: {cache.problem}"))
    return rows


def local_docker() -> Docker | None:
    """The engine, when one answers: what it has made is shown beside the plan."""
    try:
        docker = Docker.discover()
        docker.ping()
    except HaloError:
        return None
    return docker


def plan_builder(docker: Docker | None) -> Builder:
    """The engine's builder; where there is none usable (no engine, or a CLI without buildx),
    the built-in BuildKit's `docker build`: a plan is made on any host, a build says why not."""
    if docker is not None:
        try:
            return docker.builder
        except HaloError:
            pass
    return Builder("docker", buildx=False)


def _stages(repo: Path, catalog: Catalog, plan: Plan, docker: Docker | None) -> tuple[Stage, ...]:
    from halo.images.evaluate.bases import base_ref
    from halo.images.realise.base import base_state

    image = plan.image
    made = {n.base.name: n for n in plan.nodes if isinstance(n, MakeBase)}
    roles = [("builder", image.builder or image.base)] if image.builder or image.sources else []
    out = []
    for role, name in [*roles, ("runtime", image.base)]:
        b = catalog.bases[name]
        node = made.get(name)
        ref = node.ref if node else base_ref(b, repo, plan.platform)
        image_id = base_state(node, docker).image_id if node else None
        lock = f"pins/debian.{name}{plan.platform.suffix}.lock.toml"
        out.append(Stage(role, name, ref, f"{b.recipe} {b.suite} from {lock}", image_id))
    return tuple(out)


def image_plan(
    repo: Path,
    catalog: Catalog,
    image: Image,
    store: Store,
    docker: Docker | None,
    platform: Platform = AMD64,
) -> BuildPlan:
    """The plan `halo image build` would realise here: evaluated (pure), then shown with how
    this host would run it and what it already has."""
    plan = evaluate(repo, catalog, image, platform)
    return view(repo, catalog, plan, store, docker)


def view(
    repo: Path, catalog: Catalog, plan: Plan, store: Store, docker: Docker | None
) -> BuildPlan:
    from halo.builder.record import read_record

    target: ImageNode = plan.target
    wheels = plan.node(target.lock)
    lock = load_lock(repo / wheels.lock)  # type: ignore[union-attr]
    if target.method == "dockerfile":
        from halo.images.realise.build import dockerfile_recipe

        recipe = dockerfile_recipe(repo, target, plan_builder(docker), no_cache=False)
        context, iidfile = str(recipe.context), str(recipe.iidfile)
        command = Command(recipe.command.argv, recipe.command.cwd, recipe.command.env)
    else:
        from halo.images.realise.assemble import assembly_recipe

        arecipe = assembly_recipe(repo, target, lock.platform, lock.python)
        context, iidfile = str(arecipe.work), ""
        command = Command(arecipe.install.argv, arecipe.install.cwd, arecipe.install.env)
    artifacts = tuple(
        ArtifactPlan(pkg.name, pkg.version, a.file, a.sha256, a.size, store.has(a.sha256))
        for pkg in lock.packages
        for a in pkg.artifacts
    )
    derivations = tuple(
        DerivationPlan(
            d.name, d.pin.commit, d.hash, d.toolchain.kind, read_record(store, d.hash) is not None
        )
        for d in plan.derivations()
    )
    return BuildPlan(
        image=plan.image.name,
        platform=str(plan.platform),
        moving_ref=target.moving_ref,
        immutable_ref=target.immutable_ref,
        input_hash=target.hash,
        inputs=target.inputs,
        stages=_stages(repo, catalog, plan, docker),
        derivations=derivations,
        lock=wheels.lock,  # type: ignore[union-attr]
        artifacts=artifacts,
        context=context,
        iidfile=iidfile,
        command=command,
        graph=plan_dict(plan),
        evaluation=plan,
        lock_data=lock,
    )


def render_plan(
    repo: Path, catalog: Catalog, plan: BuildPlan, store: Store, docker: Docker | None
) -> str:
    image = plan.evaluation.image
    base = catalog.bases[image.base]
    arts = artifact_sizes(plan.lock_data, store)
    lines = [f"plan {plan.image} ({plan.platform}): {plan.moving_ref} + {plan.immutable_ref}"]
    lines.append(f"input hash: {plan.input_hash}")
    lines.append(
        table(("input", "value"), [(k, _short(v)) for k, v in sorted(plan.inputs.items())])
    )

    lines.append("\ngraph (dependency order; realised in this order):")
    lines.append(
        table(
            ("node", "needs"),
            [(str(n["id"]), ", ".join(n["deps"]) or "-") for n in plan.graph["nodes"]],  # type: ignore[index, union-attr, attr-defined]
        )
    )

    lines.append("\nstages:")
    lines.append(
        table(
            ("stage", "base", "ref", "recipe"),
            [(s.stage, s.base, s.ref, s.recipe) for s in plan.stages],
        )
    )

    drvs = plan.evaluation.derivations()
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
    from halo.images.evaluate.bases import os_lock_file
    from halo.pins.deblock import load_deb_lock

    os_lock = load_deb_lock(os_lock_file(base, repo, plan.evaluation.platform))
    base_bytes = int(os_lock.total_size * DEB_UNPACK_FACTOR)
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

    if plan.evaluation.target.method == "dockerfile":
        lines.append("\nbuild command (after fetch; BuildKit, offline; in the repository):")
    else:
        lines.append(
            f"\nassembly (after fetch; offline; uv installs for {plan.platform}, "
            "nothing runs under emulation):"
        )
    lines.append("  " + plan.command.shell())
    return "\n".join(lines)


def _short(value: object) -> str:
    text = str(value)
    return text if len(text) <= 100 else text[:97] + "..."
