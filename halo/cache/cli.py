"""`halo cache push|pull`: share derivation outputs through the registry (halo.cache.oci).

``push`` publishes every derivation of the named images that is realised in the store (for
this host's toolchain), signed with ``$HALO_CACHE_SIGNING_KEY`` when set; ``pull`` brings
the entries of the named images into the store, trusted as halo.cache.trust says, so that a
build on this host compiles nothing. Both print one row per derivation.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    cache = sub.add_parser("cache", help="share compiled derivations through an OCI registry")
    csub = cache.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    for name, helptext, func in (
        ("push", "publish the realised derivations of images", _push),
        ("pull", "fetch the derivations of images into the store (no compile)", _pull),
    ):
        p = csub.add_parser(name, help=helptext)
        p.add_argument("names", nargs="*", metavar="NAME", help="images (see images/images.yaml)")
        p.add_argument("--all", action="store_true", help="every image in the catalog")
        p.add_argument(
            "--registry", help="HOST[:PORT][/PREFIX] (default: $HALO_CACHE, else $HALO_REGISTRY)"
        )
        p.set_defaults(func=func)


def _setup(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    import os

    from halo.cache.config import CACHE_VAR, configured_cache
    from halo.errors import HaloError
    from halo.images.catalog import load_catalog, selected
    from halo.paths import find_repo, store_root
    from halo.store.store import Store

    env = dict(os.environ)
    if args.registry:
        env[CACHE_VAR] = args.registry
    cache = configured_cache(env)
    if cache is None:
        raise HaloError("halo cache: no registry; pass --registry HOST[/PREFIX] or set HALO_CACHE")
    repo = find_repo()
    catalog = load_catalog(repo)
    images = selected(catalog, args.names, args.all)
    return repo, catalog, images, cache, Store(store_root())


def _push(args: argparse.Namespace) -> int:
    from halo.builder.record import read_record
    from halo.images.derivations import derivation_hash, image_derivations
    from halo.report import table

    repo, catalog, images, cache, store = _setup(args)
    rows = []
    for image in images:
        for drv in image_derivations(repo, catalog, image):
            h = derivation_hash(drv, repo)
            record = read_record(store, h)
            if record is None:
                rows.append((image.name, drv.name, h[:12], "not built here", "-"))
                continue
            pushed = cache.push(record, store)
            rows.append((image.name, drv.name, h[:12], pushed.state, record.wheel))
    print(table(("image", "source", "derivation", "cache", "wheel"), rows))
    print(f"cache: {cache.repo} (signed: {'yes' if cache.signing_key else 'no'})")
    return 0


def _pull(args: argparse.Namespace) -> int:
    from halo.builder.record import read_record, write_record
    from halo.images.derivations import derivation_hash, image_derivations
    from halo.report import table

    repo, catalog, images, cache, store = _setup(args)
    rows = []
    for image in images:
        for drv in image_derivations(repo, catalog, image):
            h = derivation_hash(drv, repo)
            if read_record(store, h) is not None:
                rows.append((image.name, drv.name, h[:12], "in the store"))
                continue
            record = cache.pull(h, store)
            if record is None:
                rows.append((image.name, drv.name, h[:12], "not in the cache"))
                continue
            write_record(store, record)
            rows.append((image.name, drv.name, h[:12], f"pulled {record.wheel}"))
    print(table(("image", "source", "derivation", "result"), rows))
    return 0
