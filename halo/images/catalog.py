"""images/images.yaml: the catalog of bases and images, as dataclasses.

Validated by halo.images.catalog_schema (pydantic, through halo.schema). A no-op build must
take well under a second, and importing pydantic and checking the catalog take a good part
of that; so a catalog that validated once is remembered, keyed by the sha256 of its bytes and
of the code that validates it, and read back from the cache as long as both are unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from pathlib import Path

from halo import __version__
from halo.errors import HaloError
from halo.images.catalog_types import Base, Catalog, Image
from halo.schema import read_bytes

__all__ = ["Base", "Catalog", "Image", "load_catalog", "parse_catalog", "selected"]

# The code that decides whether a catalog is valid: part of the cache key.
VALIDATOR_FILES = (
    "images/catalog.py",
    "images/catalog_types.py",
    "images/catalog_schema.py",
    "schema.py",
    "schema_types.py",
    "testing/tier_table.py",
)


def selected(catalog: Catalog, names: list[str], all_: bool) -> list[Image]:
    """The images a command names (or every product, with --all: stages only by name); none
    named is one error line."""
    if all_:
        return [i for i in catalog.images.values() if i.stage_of is None]
    if not names:
        raise HaloError(
            "halo image: name an image (or --all); known: " + ", ".join(sorted(catalog.images))
        )
    return [catalog.image(n) for n in names]


def parse_catalog(text: str, path: Path, repo: Path | None = None) -> Catalog:
    """The catalog in ``text``; with ``repo``, the Dockerfiles it names must exist there."""
    from halo.images.catalog_schema import parse

    return parse(text, path, repo)


def _cache_key(data: bytes) -> str:
    h = hashlib.sha256(__version__.encode() + b"\0" + data)
    package = Path(__file__).resolve().parents[1]
    for rel in VALIDATOR_FILES:
        h.update(b"\0" + (package / rel).read_bytes())
    return h.hexdigest()


def _from_cache(path: Path, cached: Path) -> Catalog | None:
    try:
        data = json.loads(cached.read_text())
        bases = {
            n: Base(
                **{
                    **b,
                    "packages": tuple(b["packages"]),
                    "env": tuple((str(k), str(v)) for k, v in b["env"]),
                }
            )
            for n, b in data["bases"].items()
        }
        images = {
            n: Image(
                **{
                    **i,
                    **{k: tuple(i[k]) for k in ("cuda_arch", "sources", "tiers")},
                    "args": tuple((str(k), str(v)) for k, v in i["args"]),
                    "gate": None if i["gate"] is None else tuple(i["gate"]),
                    "unavailable": tuple((str(k), str(v)) for k, v in i["unavailable"]),
                }
            )
            for n, i in data["images"].items()
        }
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return Catalog(path=path, bases=bases, images=images)


def load_catalog(repo: Path) -> Catalog:
    """The catalog, from the memo when its bytes and the validating code are unchanged (and
    its Dockerfiles still exist), else validated in full."""
    from halo.paths import cache_home

    path = repo / "images" / "images.yaml"
    data = read_bytes(path)
    memo = cache_home() / "validated" / f"catalog-{_cache_key(data)}.json"
    catalog = _from_cache(path, memo)
    if catalog is not None:
        named = [i.dockerfile for i in catalog.images.values()]
        if all((repo / rel).is_file() for rel in named):
            return catalog
    from halo.schema import decode

    return dataclasses.replace(parse_catalog(decode(data, str(path)), path, repo), memo=memo)


def remember(catalog: Catalog) -> None:
    """Keep a catalog that was validated in full, for the next command to skip the check.

    Called once a build succeeded, so a command that fails on bad input writes nothing.
    """
    if catalog.memo is None:
        return
    record = {
        "bases": {n: dataclasses.asdict(b) for n, b in catalog.bases.items()},
        "images": {n: dataclasses.asdict(i) for n, i in catalog.images.items()},
    }
    with contextlib.suppress(OSError):  # a read-only or full cache only costs speed
        from halo.atomic import write_text

        write_text(catalog.memo, json.dumps(record, sort_keys=True))
