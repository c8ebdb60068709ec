"""Evaluate an image for a platform into its plan: every node, its inputs and their hash.

`evaluate(repo, catalog, image, platform)` reads the checkout (the catalog, the platform's
locks, the patches, halo's own source) and nothing else: no engine, no store, no network. The
plan is ordered so that a node comes after what it needs: the OS locks' fetches, the bases,
the lock's fetch, the derivations, the image. Realisation walks it in that order.

amd64 images are realised by their Dockerfile (BuildKit on this amd64 host); the others are
assembled (halo.images.realise.assemble): the same layers, made here for the target platform
with uv (--python-platform), nothing run under emulation. Their input hash names the platform
and the assembler; amd64's is exactly what it was before there were platforms.
"""

from __future__ import annotations

from pathlib import Path

from halo import __version__
from halo.errors import HaloError
from halo.hashing import sha256_json
from halo.images.catalog_types import Base, Catalog, Image
from halo.images.graph import (
    AMD64,
    INPUT_LABEL,
    LABEL_PREFIX,
    UV_VERSION,
    DerivationNode,
    FetchDebs,
    FetchWheels,
    ImageNode,
    MakeBase,
    Node,
    Plan,
    Platform,
    set_for,
    source_date_epoch,
)
from halo.pins.names import lock_path


def unavailable(image: Image, platform: Platform) -> str | None:
    """Why the catalog says ``image`` is not built for ``platform`` (None: it is)."""
    return dict(image.unavailable).get(str(platform))


def wanted_bases(catalog: Catalog, image: Image) -> list[Base]:
    """The bases a build needs made: the runtime one, and the builder when Docker compiles
    (the default; halo.builder.kind)."""
    wanted = [catalog.bases[image.base]]
    if image.sources:
        from halo.builder.kind import builder_kind

        builder = catalog.bases[image.builder or image.base]
        if builder_kind() == "docker" and builder not in wanted:
            wanted.append(builder)
    return wanted


def base_nodes(repo: Path, base: Base, platform: Platform) -> tuple[FetchDebs, MakeBase]:
    from halo.hashing import sha256_file
    from halo.images.evaluate.bases import base_ref, deb_inputs, os_lock_file, recipe_hash

    lock = os_lock_file(base, repo, platform)
    fetch = FetchDebs(
        id=f"fetch-debs:{base.name}@{platform}",
        base=base.name,
        platform=platform,
        lock=lock.relative_to(repo).as_posix(),
        lock_sha256=sha256_file(lock),
        inputs=deb_inputs(base, platform),
    )
    make = MakeBase(
        id=f"base:{base.name}@{platform}",
        base=base,
        platform=platform,
        recipe=recipe_hash(base, repo, platform),
        ref=base_ref(base, repo, platform),
        deps=(fetch.id,),
    )
    return fetch, make


def _fetch_wheels(repo: Path, set_name: str, platform: Platform) -> FetchWheels:
    from halo.hashing import sha256_file

    name = set_for(set_name, platform)
    lock = lock_path(repo / "pins", name)
    if not lock.is_file():
        raise HaloError(f"{lock}: lock not found; run `halo pins lock {name}`")
    return FetchWheels(
        id=f"fetch-wheels:{name}",
        set=name,
        platform=platform,
        lock=lock.relative_to(repo).as_posix(),
        lock_sha256=sha256_file(lock),
    )


def labels(image: Image, input_hash: str) -> dict[str, str]:
    """The OCI labels baked into the image config: only what the inputs determine.

    Labels are part of the image ID. Where the source came from (revision, repository URL: per
    commit, per clone) is an annotation on the manifest at push time (halo.images.provenance).
    """
    return {
        f"{LABEL_PREFIX}.title": image.moving_ref,
        f"{LABEL_PREFIX}.version": __version__,
        INPUT_LABEL: input_hash,
    }


def evaluate(repo: Path, catalog: Catalog, image: Image, platform: Platform = AMD64) -> Plan:
    """The plan of ``image`` on ``platform``: a pure function of the checkout and the platform."""
    from halo.images.evaluate.bases import recipe_hash
    from halo.images.evaluate.inputs import image_inputs

    reason = unavailable(image, platform)
    if reason is not None:
        raise HaloError(f"image {image.name}: not built for {platform}: {reason}")
    nodes: list[Node] = []
    made: dict[str, MakeBase] = {}
    for base in wanted_bases(catalog, image):
        fetch, make = base_nodes(repo, base, platform)
        nodes += [fetch, make]
        made[base.name] = make
    base = catalog.bases[image.base]
    builder = catalog.bases[image.builder] if image.builder else None
    wheels = _fetch_wheels(repo, image.pins, platform)
    nodes.append(wheels)
    sde = str(source_date_epoch())
    inputs = image_inputs(
        repo,
        image,
        repo / wheels.lock,
        made[base.name].recipe,
        recipe_hash(builder, repo, platform) if builder else None,
        build_args={
            "PYTHON": base.python,
            "CUDA_ARCH": ";".join(image.cuda_arch),
            "SOURCE_DATE_EPOCH": sde,
            **dict(image.args),
        },
    )
    parts = dict(inputs.parts)
    drv_nodes = _derivations(repo, catalog, image, platform, made, nodes)
    if image.sources:
        # The kernels layer is what its derivations made: their hashes (toolchain included).
        parts["derivations"] = {d.name: d.hash for d in drv_nodes}
    method = "dockerfile" if platform == AMD64 else "assemble"
    if method == "assemble":
        parts["platform"] = str(platform)
        parts["assembly"] = {"installer": f"uv {UV_VERSION}", "python_platform": True}
    input_hash = sha256_json(parts)
    target = ImageNode(
        id=f"image:{image.name}@{platform}",
        image=image,
        platform=platform,
        inputs=parts,
        hash=input_hash,
        method=method,
        base=made[base.name].id,
        builder=made[builder.name].id if builder and builder.name in made else None,
        lock=wheels.id,
        derivations=tuple(d.id for d in drv_nodes),
        build_args={
            "BASE": made[base.name].ref,
            "PYTHON": base.python,
            "SOURCE_DATE_EPOCH": sde,
            **dict(image.args),
        },
        labels=labels(image, input_hash),
        deps=tuple(
            x
            for x in (
                made[base.name].id,
                made[builder.name].id if builder and builder.name in made else None,
                wheels.id,
                *(d.id for d in drv_nodes),
            )
            if x is not None
        ),
    )
    return Plan(image, platform, (*nodes, target))


def _derivations(
    repo: Path,
    catalog: Catalog,
    image: Image,
    platform: Platform,
    made: dict[str, MakeBase],
    nodes: list[Node],
) -> list[DerivationNode]:
    """The image's source derivations, appended to ``nodes`` after what they need."""
    if not image.sources:
        return []
    from halo.images.evaluate.derivations import (
        BUILDER_SET,
        derivation_node,
        image_derivations,
    )

    drvs = image_derivations(repo, catalog, image, platform)
    toolchain_lock = _fetch_wheels(repo, BUILDER_SET, platform)
    nodes.append(toolchain_lock)
    builder = catalog.bases[image.builder or image.base]
    deps = tuple(x for x in (made.get(builder.name), toolchain_lock) if x is not None)
    out = [derivation_node(d, repo, tuple(x.id for x in deps)) for d in drvs]
    nodes += out
    return out


def plan_dict(plan: Plan) -> dict[str, object]:
    """The graph as data (`halo image plan --json`'s "graph"): nodes in dependency order."""
    rows: list[dict[str, object]] = []
    for n in plan.nodes:
        row: dict[str, object] = {"id": n.id, "kind": n.kind, "deps": list(n.deps)}
        if isinstance(n, FetchDebs | FetchWheels):
            row.update(lock=n.lock, lock_sha256=n.lock_sha256)
        elif isinstance(n, MakeBase):
            row.update(ref=n.ref, recipe=n.recipe)
        elif isinstance(n, DerivationNode):
            row.update(hash=n.hash, commit=n.pin.commit, toolchain=n.inputs["toolchain"])
        elif isinstance(n, ImageNode):
            row.update(hash=n.hash, method=n.method, immutable_ref=n.immutable_ref)
        rows.append(row)
    return {"image": plan.image.name, "platform": str(plan.platform), "nodes": rows}
