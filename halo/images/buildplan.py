"""The build as data: an image is evaluated into a plan, which `halo image build` realises.

As Nix evaluates a derivation before realising it: the input hash (computed once, here), the
bases, the source derivations, the lock's artifacts, the stages and the exact build command
are decided by `evaluate` and `make_plan`; the build then fetches, realises the derivations,
stages the context and runs exactly `BuildPlan.command`, and `halo image plan --json` prints
the same object. Nothing in the build recomputes what the plan says.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from halo import __version__
from halo.images.base import BaseState, base_ref, base_state, recipe_hash, source_date_epoch
from halo.images.catalog import Base, Catalog, Image
from halo.images.docker import Builder, Docker, build_argv
from halo.images.inputs import Inputs, image_inputs
from halo.paths import cache_home, per_engine

if TYPE_CHECKING:
    from halo.images.derivations import Derivation
    from halo.pins.lockfile import Lock
    from halo.store.store import Store

# Evaluating an image imports only what the input hash needs: a no-op build (the common case,
# budgeted well under a second) pays for the hash and one lookup, not for parsing the lock.

LABEL_PREFIX = "org.opencontainers.image"
INPUT_LABEL = "io.halo.input-hash"


@dataclass(frozen=True)
class Evaluation:
    """What the input hash is made of, looked up and hashed once."""

    image: Image
    inputs: Inputs
    states: dict[str, BaseState]  # base name -> its state on this machine
    derivations: tuple[Derivation, ...]


def wanted_bases(catalog: Catalog, image: Image) -> list[Base]:
    """The bases a build needs made here: the runtime one, and the builder when Docker compiles
    (the default; halo.builder.kind)."""
    wanted = [catalog.bases[image.base]]
    if image.sources:
        from halo.builder.kind import builder_kind

        builder = catalog.bases[image.builder or image.base]
        if builder_kind() == "docker" and builder not in wanted:
            wanted.append(builder)
    return wanted


def base_states(
    repo: Path, catalog: Catalog, image: Image, docker: Docker | None
) -> dict[str, BaseState]:
    names = dict.fromkeys(filter(None, (image.base, image.builder)))
    return {n: base_state(catalog.bases[n], repo, docker) for n in names}


def evaluate(
    repo: Path,
    catalog: Catalog,
    image: Image,
    docker: Docker | None,
    states: dict[str, BaseState] | None = None,
) -> Evaluation:
    """The image's inputs and their hash; ``states`` are the bases' states when known already."""
    states = states if states is not None else base_states(repo, catalog, image, docker)
    base = catalog.bases[image.base]
    builder = catalog.bases[image.builder] if image.builder else None
    inputs = image_inputs(
        repo,
        image,
        states[base.name],
        recipe_hash(base, repo),
        states[builder.name] if builder else None,
        recipe_hash(builder, repo) if builder else None,
        build_args={
            "PYTHON": base.python,
            "CUDA_ARCH": ";".join(image.cuda_arch),
            "SOURCE_DATE_EPOCH": str(source_date_epoch()),
            **dict(image.args),
        },
    )
    if not image.sources:
        return Evaluation(image, inputs, states, ())
    # The kernels layer is what its derivations made: their hashes (toolchain included).
    from halo.images.derivations import derivation_hash, image_derivations

    drvs = tuple(image_derivations(repo, catalog, image))
    parts = {**inputs.parts, "derivations": {d.name: derivation_hash(d, repo) for d in drvs}}
    return Evaluation(image, Inputs(parts), states, drvs)


def resolve_inputs(repo: Path, catalog: Catalog, image: Image, docker: Docker | None) -> Inputs:
    return evaluate(repo, catalog, image, docker).inputs


def build_args(catalog: Catalog, image: Image, repo: Path) -> dict[str, str]:
    """The Dockerfile's build arguments."""
    base = catalog.bases[image.base]
    return {
        "BASE": base_ref(base, repo),
        "PYTHON": base.python,
        "SOURCE_DATE_EPOCH": str(source_date_epoch()),
        **dict(image.args),
    }


def labels(image: Image, inputs: Inputs) -> dict[str, str]:
    """The OCI labels baked into the image config: only what the inputs determine.

    Labels are part of the image ID. Where the source came from (revision, repository URL: per
    commit, per clone) is an annotation on the manifest at push time (halo.images.provenance).
    """
    return {
        f"{LABEL_PREFIX}.title": image.moving_ref,
        f"{LABEL_PREFIX}.version": __version__,
        INPUT_LABEL: inputs.hash,
    }


def context_dir(image: Image) -> Path:
    """The image's build context: one fixed path per engine, updated in place
    (halo.images.context)."""
    return per_engine(cache_home() / "contexts") / image.name


@dataclass(frozen=True)
class Stage:
    stage: str  # builder | runtime
    base: str
    ref: str
    recipe: str
    image_id: str | None  # None: not made (or pulled) here yet


@dataclass(frozen=True)
class DerivationPlan:
    name: str
    commit: str
    hash: str
    toolchain: str
    in_store: bool  # its record and wheel are in the store: nothing to compile


@dataclass(frozen=True)
class ArtifactPlan:
    package: str
    version: str
    file: str
    sha256: str
    size: int | None
    in_store: bool


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
    # What realising needs beyond the data above; not part of the printed plan.
    evaluation: Evaluation = field(repr=False, compare=False, metadata={"data": False})
    lock_data: Lock = field(repr=False, compare=False, metadata={"data": False})

    @property
    def runtime(self) -> Stage:
        return next(s for s in self.stages if s.stage == "runtime")

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


def _stages(repo: Path, catalog: Catalog, ev: Evaluation) -> tuple[Stage, ...]:
    image = ev.image
    roles = [("builder", image.builder or image.base)] if image.builder or image.sources else []
    out = []
    for role, name in [*roles, ("runtime", image.base)]:
        b = catalog.bases[name]
        state = ev.states.get(name) or base_state(b, repo, None)
        out.append(
            Stage(
                role,
                name,
                state.ref,
                f"{b.recipe} {b.suite} from pins/debian.{name}.lock.toml",
                state.image_id,
            )
        )
    return tuple(out)


def _derivations(repo: Path, store: Store, ev: Evaluation) -> tuple[DerivationPlan, ...]:
    if not ev.derivations:
        return ()
    from halo.builder.record import read_record
    from halo.images.derivations import derivation_hash

    out = []
    for drv in ev.derivations:
        h = derivation_hash(drv, repo)
        cached = read_record(store, h) is not None
        out.append(DerivationPlan(drv.name, drv.pin.commit, h, drv.toolchain.kind, cached))
    return tuple(out)


def make_plan(
    repo: Path,
    catalog: Catalog,
    ev: Evaluation,
    lock: Lock,
    store: Store,
    builder: Builder,
    no_cache: bool = False,
) -> BuildPlan:
    """The whole build, from one evaluation and one parsed lock."""
    from halo.pins.lockfile import lock_path

    image, inputs = ev.image, ev.inputs
    ctx = context_dir(image)
    iid = ctx.with_name(f".{image.name}.iid")
    argv = build_argv(
        builder,
        ctx,
        Path(image.dockerfile),  # relative: the command runs in the repository
        [],  # untagged: the normalised image is what gets the tags (halo.images.reproducible)
        build_args(catalog, image, repo),
        labels(image, inputs),
        "none",
        iid,
        no_cache=no_cache,  # from scratch: otherwise it would only replay the cache
    )
    artifacts = tuple(
        ArtifactPlan(pkg.name, pkg.version, a.file, a.sha256, a.size, store.has(a.sha256))
        for pkg in lock.packages
        for a in pkg.artifacts
    )
    return BuildPlan(
        image=image.name,
        moving_ref=image.moving_ref,
        immutable_ref=image.immutable_ref(inputs.hash),
        input_hash=inputs.hash,
        inputs=inputs.parts,
        stages=_stages(repo, catalog, ev),
        derivations=_derivations(repo, store, ev),
        lock=lock_path(repo / "pins", image.pins).relative_to(repo).as_posix(),
        artifacts=artifacts,
        context=str(ctx),
        iidfile=str(iid),
        command=Command(tuple(argv), str(repo), {"DOCKER_BUILDKIT": "1"}),
        evaluation=ev,
        lock_data=lock,
    )
