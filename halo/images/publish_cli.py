"""`halo image stage|promote|push|verify-public|ecr-public-login`: the publishing commands."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def register(isub: argparse._SubParsersAction) -> None:
    p = isub.add_parser(
        "stage", help="push the image built for this checkout, by digest, to a staging repository"
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("--registry", help="staging HOST[/PREFIX] (default: $HALO_STAGING_REGISTRY)")
    p.set_defaults(func=_stage)

    p = isub.add_parser(
        "promote", help="publish a staged digest under the moving and immutable tags (no rebuild)"
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("--from", dest="source", required=True, metavar="REPO@sha256:…")
    p.add_argument("--registry", help="release HOST[/ALIAS] (default: $HALO_REGISTRY)")
    _override_flag(p)
    p.set_defaults(func=_promote)

    p = isub.add_parser(
        "push", help="publish images built here: push by digest, then tag (stage + promote)"
    )
    p.add_argument("names", nargs="*", metavar="NAME")
    p.add_argument("--all", action="store_true", help="every image in the catalog")
    p.add_argument("--registry", help="HOST[/ALIAS] to publish under (default: $HALO_REGISTRY)")
    p.add_argument(
        "--verify-public",
        action="store_true",
        help="then pull both tags by digest with no credentials (halo image verify-public)",
    )
    _override_flag(p)
    p.set_defaults(func=_push)

    p = isub.add_parser(
        "verify-public", help="check, with no credentials, that both tags pull by one digest"
    )
    p.add_argument("names", nargs="*", metavar="NAME")
    p.add_argument("--all", action="store_true", help="every image in the catalog")
    p.add_argument("--registry", help="HOST[/ALIAS] (default: $HALO_REGISTRY)")
    p.set_defaults(func=_verify_public)

    p = isub.add_parser(
        "ecr-public-login", help="docker login to ECR Public with the AWS CLI's login password"
    )
    p.add_argument("--registry", help="public.ecr.aws/ALIAS (default: $HALO_REGISTRY)")
    p.set_defaults(func=_ecr_login)


def _override_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--override-tests",
        metavar="WHO: WHY",
        help="publish although a tier the catalog's gate requires has no passing attestation "
        "signed by a key in $HALO_TRUSTED_KEYS; recorded in a signed attestation "
        "($HALO_ATTEST_KEY) attached to the released digest",
    )


def _override(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from halo.images.publish import Override

    return Override.parse(args.override_tests) if args.override_tests is not None else None


def _progress(line: str) -> None:
    from halo.report import say

    say(line)


def _catalog():  # type: ignore[no-untyped-def]
    from halo.images.catalog import load_catalog
    from halo.paths import find_repo

    repo = find_repo()
    return repo, load_catalog(repo)


def _github_output(key: str, value: str) -> None:
    """A step output when running in GitHub Actions (how a stage job hands its digest on)."""
    if path := os.environ.get("GITHUB_OUTPUT"):
        with Path(path).open("a") as fh:
            fh.write(f"{key}={value}\n")


def _stage(args: argparse.Namespace) -> int:
    from halo.images.publish import registry_from, stage

    repo, catalog = _catalog()
    registry = registry_from(args.registry, "HALO_STAGING_REGISTRY")
    ref, uploaded = stage(repo, catalog.image(args.name), registry, _progress)
    _github_output("ref", ref)
    print(f"staged {ref} ({uploaded} blobs uploaded)")
    return 0


def _published(rows: list) -> None:  # type: ignore[type-arg]
    from halo.report import table

    print(
        table(
            ("immutable tag", "state", "moving tag", "digest"),
            [
                (
                    p.immutable,
                    p.state,
                    p.moving + (" (updated)" if p.moving_updated else ""),
                    p.digest[:19],
                )
                for p in rows
            ],
        )
    )


def _promote(args: argparse.Namespace) -> int:
    from halo.images.publish import promote, registry_from

    repo, catalog = _catalog()
    image = catalog.image(args.name)
    override = _override(args)
    _published(
        [promote(image, args.source, registry_from(args.registry), _progress, override, repo)]
    )
    return 0


def _push(args: argparse.Namespace) -> int:
    from halo.images.catalog import selected
    from halo.images.publish import push, registry_from

    repo, catalog = _catalog()
    override = _override(args)
    registry = registry_from(args.registry)
    images = selected(catalog, args.names, args.all)
    _published([push(repo, image, registry, _progress, override) for image in images])
    if args.verify_public:
        _print_public(images, registry)
    return 0


def _verify_public(args: argparse.Namespace) -> int:
    from halo.images.catalog import selected
    from halo.images.publish import registry_from

    _, catalog = _catalog()
    _print_public(selected(catalog, args.names, args.all), registry_from(args.registry))
    return 0


def _print_public(images: list, registry: str) -> None:  # type: ignore[type-arg]
    from halo.images.publish import verify_public
    from halo.report import table

    rows = []
    for image in images:
        for check in verify_public(image, registry):
            rows.append((check.ref, check.digest[:19], check.blobs, "pulls anonymously"))
    print(table(("tag", "digest", "blobs", "check"), rows))


def _ecr_login(args: argparse.Namespace) -> int:
    from halo.images.docker import Docker
    from halo.images.ecr_public import docker_login, login_password
    from halo.images.publish import registry_from
    from halo.registry.refs import parse_registry

    host, _ = parse_registry(registry_from(args.registry))
    docker_login(Docker.discover().exe, host, login_password())
    print(f"{host}: logged in (docker keeps the password; it expires in 12 hours)")
    return 0
