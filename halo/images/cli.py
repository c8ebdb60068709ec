"""`halo image build|plan|diff|base|stamp`, and the publishing commands of publish_cli."""

from __future__ import annotations

import argparse
from pathlib import Path


def _names_or_all(p: argparse.ArgumentParser, all_help: str) -> None:
    p.add_argument("names", nargs="*", metavar="NAME")
    p.add_argument("--all", action="store_true", help=all_help)


def _platform(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--platform",
        default="linux/amd64",
        metavar="OS/ARCH",
        help="the target platform: linux/amd64 (default) or linux/arm64 (assembled here with "
        "uv installing for it; nothing runs under emulation)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    image = sub.add_parser("image", help="plan, build and publish images")
    isub = image.add_subparsers(dest="image_command", metavar="ACTION", required=True)

    p = isub.add_parser(
        "build", help="build images hermetically (no-op when the input hash exists)"
    )
    _names_or_all(p, "every image in the catalog, in dependency order")
    p.add_argument(
        "--force",
        action="store_true",
        help="rebuild from scratch (no layer cache) even if the input hash is already tagged",
    )
    _platform(p)
    p.set_defaults(func=_build)

    p = isub.add_parser(
        "kernels",
        help="realise an image's source derivations: from the store, the cache, or compiled offline",
    )
    _names_or_all(p, "every image in the catalog")
    p.add_argument(
        "--only", action="append", default=[], metavar="SOURCE", help="only this source pin"
    )
    p.add_argument(
        "--first-object",
        action="store_true",
        help="compile each source only up to its first nvcc object, in the builder image, and "
        "stop: a check of the sources, patches and toolchain before hours of compiling "
        "(nothing is stored)",
    )
    p.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="with --first-object: a folder that receives each first object file and its nvcc command",
    )
    p.set_defaults(func=_kernels)

    p = isub.add_parser("plan", help="print what a build would do, without Docker")
    _names_or_all(p, "every image in the catalog")
    _platform(p)
    p.add_argument(
        "--json",
        action="store_true",
        help="print the plans as a JSON list: what `halo image build` runs, as data",
    )
    p.set_defaults(func=_plan)

    p = isub.add_parser(
        "diff", help="compare what two images ship, file by file (exit 1 if they differ)"
    )
    p.add_argument("left", metavar="REF")
    p.add_argument("right", metavar="REF")
    p.set_defaults(func=_diff)

    p = isub.add_parser(
        "verify",
        help="rebuild from scratch and compare image IDs with the image built here (exit 1 if they differ)",
    )
    _names_or_all(p, "every image in the catalog")
    p.add_argument(
        "--expect",
        metavar="IMAGE_ID",
        help="compare with this image ID (one built elsewhere: CI's, a published one) instead of "
        "the image built here; one NAME",
    )
    _platform(p)
    p.set_defaults(func=_verify)

    p = isub.add_parser(
        "export",
        help="write a built image as an Enroot squashfs or an Apptainer SIF (same image, same bytes)",
    )
    p.add_argument("name", metavar="NAME", help="a catalog name (cpu) or an image reference")
    p.add_argument("--format", required=True, choices=("sqsh", "sif"))
    p.add_argument("out", metavar="OUT", type=Path)
    p.set_defaults(func=_export)

    p = isub.add_parser(
        "size",
        help="measure an image's compressed size: push it by digest to a registry (a local one) "
        "and sum its manifest's layers",
    )
    p.add_argument("names", nargs="+", metavar="NAME")
    p.add_argument(
        "--registry", help="HOST[/PREFIX] to push to (default: $HALO_TEST_REGISTRY, a local one)"
    )
    p.set_defaults(func=_size)

    p = isub.add_parser(
        "index",
        help="one tag for every platform: push each platform's image built here by digest and "
        "an OCI image index over them (--verify: check it anonymously instead)",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("--registry", help="HOST[/PREFIX] (default: $HALO_REGISTRY)")
    p.add_argument(
        "--platforms",
        default="linux/amd64,linux/arm64",
        metavar="LIST",
        help="the platforms the index names, comma-separated (default: linux/amd64,linux/arm64)",
    )
    p.add_argument("--verify", action="store_true", help="pull the index and each platform")
    p.set_defaults(func=_index)

    from halo.images import publish_cli

    publish_cli.register(isub)  # stage, promote, push, verify-public, ecr-public-login

    p = isub.add_parser(
        "base", help="make (or find) the base of an image: the fetch phase of its OS layer"
    )
    p.add_argument("names", nargs="+", metavar="NAME")
    _platform(p)
    p.set_defaults(func=_base)

    p = isub.add_parser(
        "stamp", help="(runs inside an image build) apply patches, write build.json and SBOM"
    )
    p.add_argument("--inputs", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sbom", type=Path)
    p.add_argument("--apply-patches", action="store_true")
    p.set_defaults(func=_stamp)


def _selected(catalog, names: list[str], all_: bool) -> list:  # type: ignore[no-untyped-def]
    from halo.images.catalog import selected

    return selected(catalog, names, all_)


def _build(args: argparse.Namespace) -> int:
    from halo.images.build import build_image, report
    from halo.images.catalog import load_catalog, remember
    from halo.images.docker import Docker
    from halo.images.graph import parse_platform
    from halo.paths import find_repo, store_root
    from halo.store.store import Store

    platform = parse_platform(args.platform)
    repo = find_repo()
    catalog = load_catalog(repo)
    images = _selected(catalog, args.names, args.all)
    store = Store(store_root())
    built = []
    for image in images:
        result = build_image(repo, catalog, image, store, force=args.force, platform=platform)
        if not result.rebuilt:
            print(
                f"{result.moving_ref}: up to date (input hash {result.inputs.hash[:12]}), nothing to build"
            )
        built.append(result)
    print(report(built, Docker.discover()))
    remember(catalog)
    return 0


def _export(args: argparse.Namespace) -> int:
    import hashlib

    from halo.images.catalog import load_catalog
    from halo.images.docker import Docker
    from halo.images.export import export
    from halo.paths import find_repo

    ref = args.name
    if ":" not in ref and "/" not in ref:
        ref = load_catalog(find_repo()).image(ref).moving_ref
    docker = Docker.discover()
    docker.ping()
    out = export(docker, ref, args.format, args.out)
    digest = hashlib.sha256()
    with out.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    print(f"{out}: {ref} as {args.format}, {out.stat().st_size} bytes, sha256 {digest.hexdigest()}")
    return 0


def _index(args: argparse.Namespace) -> int:
    from halo.images.catalog import load_catalog
    from halo.images.graph import parse_platform
    from halo.images.index import push_index, verify_index
    from halo.images.publish import registry_from
    from halo.paths import find_repo
    from halo.report import say, table

    platforms = [parse_platform(p) for p in args.platforms.split(",") if p.strip()]
    registry = registry_from(args.registry)
    repo = find_repo()
    image = load_catalog(repo).image(args.name)
    for p in platforms:
        if reason := dict(image.unavailable).get(str(p)):
            from halo.errors import HaloError

            raise HaloError(f"image {image.name}: not built for {p}: {reason}")
    if args.verify:
        checks = verify_index(image, registry, platforms)
        rows = [(c.platform, c.digest[:19], c.input_hash[:12], str(c.blobs)) for c in checks]
        print(table(("platform", "manifest", "input hash", "blobs"), rows))
        return 0
    ref, entries = push_index(repo, image, registry, platforms, say)
    rows = [(str(e.platform), e.manifest.digest[:19], e.input_hash[:12]) for e in entries]
    print(table(("platform", "manifest", "input hash"), rows))
    print(f"{ref}: an OCI image index over {len(entries)} platforms")
    return 0


def _kernels(args: argparse.Namespace) -> int:
    from halo.cache.config import configured_cache
    from halo.errors import HaloError
    from halo.images.catalog import load_catalog
    from halo.images.evaluate.derivations import derivation_node, image_derivations
    from halo.images.plan import local_docker
    from halo.images.realise.derivation import first_object, realise, realiser
    from halo.paths import find_repo, store_root
    from halo.report import table
    from halo.store.store import Store

    if args.keep is not None and not args.first_object:
        raise HaloError(
            "--keep: only with --first-object (a full build keeps its wheel in the store)"
        )
    repo = find_repo()
    catalog = load_catalog(repo)
    docker = local_docker()
    r = realiser(repo, Store(store_root()), docker, configured_cache())
    rows = []
    for image in _selected(catalog, args.names, args.all):
        drvs = [derivation_node(d, repo) for d in image_derivations(repo, catalog, image)]
        unknown = sorted(set(args.only) - {d.name for d in drvs})
        if unknown:
            raise HaloError(f"--only {unknown[0]}: not a source of image {image.name}")
        for drv in drvs:
            if args.only and drv.name not in args.only:
                continue
            if args.first_object:
                f = first_object(drv, r, args.keep)
                rows.append(
                    (
                        image.name, drv.name, f.hash[:12], " ".join(f.targets),
                        Path(f.source).name, f"{f.compile_s:.0f}s", f"{f.seconds:.0f}s",
                        f"{f.size} B",
                    )
                )  # fmt: skip
                continue
            x = realise(drv, r)
            when = f"{x.seconds:.0f}s" if x.built else "-"
            rows.append(
                (
                    image.name,
                    drv.name,
                    drv.hash[:12],
                    x.origin,
                    when,
                    x.wheel.name,
                )
            )
    if args.first_object:
        head = ("image", "source", "derivation", "targets", "first object", "nvcc", "total", "size")
        print(table(head, rows))
        print(
            "first objects only: nothing stored; `halo image plan NAME` says what a full build takes"
        )
        return 0
    print(table(("image", "source", "derivation", "from", "compile", "wheel"), rows))
    return 0


def _size(args: argparse.Namespace) -> int:
    import os

    from halo.errors import HaloError
    from halo.images.catalog import load_catalog
    from halo.images.size import measure
    from halo.paths import find_repo
    from halo.report import human_bytes, say, table

    registry = args.registry or os.environ.get("HALO_TEST_REGISTRY", "")
    if not registry:
        raise HaloError(
            "halo image size: no registry: give --registry HOST or set HALO_TEST_REGISTRY"
        )
    repo = find_repo()
    catalog = load_catalog(repo)
    images = [catalog.image(n) for n in args.names]  # every name checked before any push
    rows = []
    for image in images:
        m = measure(repo, image, registry, say)
        rows.append((m.ref, m.layers, human_bytes(m.compressed), human_bytes(m.on_disk),
                     m.digest[:19]))  # fmt: skip
    print(table(("image", "layers", "compressed (pushed)", "on disk", "digest"), rows))
    return 0


def _plan(args: argparse.Namespace) -> int:
    import json

    from halo.images.catalog import load_catalog
    from halo.images.graph import parse_platform
    from halo.images.plan import image_plan, local_docker, render_plan
    from halo.paths import find_repo, store_root
    from halo.store.store import Store

    platform = parse_platform(args.platform)
    repo = find_repo()
    catalog = load_catalog(repo)
    images = [
        i
        for i in _selected(catalog, args.names, args.all)
        # --all: the images built for the platform; a name the catalog rules out says why.
        if not (args.all and dict(i.unavailable).get(str(platform)))
    ]
    docker = local_docker()
    store = Store(store_root())
    plans = [image_plan(repo, catalog, image, store, docker, platform) for image in images]
    if args.json:
        print(json.dumps([p.to_dict() for p in plans], indent=2))
    else:
        print("\n\n".join(render_plan(repo, catalog, p, store, docker) for p in plans))
    return 0


def _image_id_arg(text: str) -> str:
    """An image ID as `docker image inspect` prints it (sha256:<64 hex>); bare hex is allowed."""
    from halo.errors import HaloError
    from halo.registry.refs import DIGEST

    image_id = text if text.startswith("sha256:") else f"sha256:{text}"
    if not DIGEST.match(image_id):
        raise HaloError(f"--expect: expected an image ID (sha256:<64 hex digits>), got {text!r}")
    return image_id


def _verify(args: argparse.Namespace) -> int:
    from halo.errors import HaloError
    from halo.images.build import verify_image
    from halo.images.catalog import load_catalog
    from halo.images.graph import parse_platform
    from halo.paths import find_repo, store_root
    from halo.report import table
    from halo.store.store import Store

    platform = parse_platform(args.platform)
    repo = find_repo()
    catalog = load_catalog(repo)
    images = _selected(catalog, args.names, args.all)
    expect = None
    if args.expect is not None:
        if len(images) != 1:
            raise HaloError("halo image verify --expect: name exactly one image")
        expect = _image_id_arg(args.expect)
    results = [
        verify_image(repo, catalog, image, Store(store_root()), platform, expect)
        for image in images
    ]
    rows = [
        (
            v.image.moving_ref,
            v.expected[:19],
            v.rebuilt[:19],
            "same"
            if v.same
            else "DIFFERENT (layers " + ", ".join(map(str, v.layers)) + ")"
            if v.layers
            else "DIFFERENT (layers not compared: the expected image is not here)"
            if v.layers is None
            else "DIFFERENT (config)",
        )
        for v in results
    ]
    column = "built here" if expect is None else "expected"
    print(table(("image", column, "rebuilt from scratch", "result"), rows))
    return 0 if all(v.same for v in results) else 1


def _diff(args: argparse.Namespace) -> int:
    from halo.images.docker import Docker
    from halo.images.manifest import content_manifest, diff_manifests

    docker = Docker.discover()
    left, right = content_manifest(docker, args.left), content_manifest(docker, args.right)
    changes = diff_manifests(left, right)
    print("\n".join(changes) if changes else f"same content: {len(left)} files")
    return 1 if changes else 0


def _base(args: argparse.Namespace) -> int:
    from halo.images.catalog import load_catalog
    from halo.images.docker import Docker
    from halo.images.evaluate.plan import base_nodes
    from halo.images.graph import parse_platform
    from halo.images.realise.base import make_base
    from halo.paths import cache_home, find_repo

    platform = parse_platform(args.platform)
    repo = find_repo()
    catalog = load_catalog(repo)
    docker = Docker.discover()
    images = [catalog.image(name) for name in args.names]
    # Evaluate every base first (a missing OS lock fails before anything is made), then make.
    wanted = {
        b: base_nodes(repo, catalog.bases[b], platform)
        for image in images
        for b in filter(None, (image.base, image.builder))
    }
    for base_name, (fetch, node) in wanted.items():
        state = make_base(node, fetch, repo, docker, cache_home() / "work")
        print(f"{base_name}{platform.suffix}: {state.ref} {state.image_id}")
    return 0


def _stamp(args: argparse.Namespace) -> int:
    from halo.images.stamp import stamp

    record = stamp(args.inputs, args.out, args.sbom, args.apply_patches)
    states = ", ".join(f"{p['name']}={p['state']}" for p in record.get("patches", [])) or "none"  # type: ignore[union-attr]
    print(f"build.json: input hash {record['input_hash'][:12]}; patches: {states}")
    return 0
