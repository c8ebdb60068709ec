"""amd64 input hashes pinned across the evaluate/realise split (and whatever comes after it).

data/plan_amd64_pinned.json was recorded before the split from the code of that day: every
image's input parts and hash, each derivation's inputs and hash, each base's recipe
definition and hash. An input hash covers files that keep changing (halo's own source, the
locks, the patches...), so "unchanged" means: the same function of the same files. For every
part the test knows which file or tree it digests; a part may differ from the record only
where it is exactly the digest of that file now (the input moved, not the function), and
with those parts put back to their recorded values the hash must be the recorded hash, byte
for byte. Anything else (a new part such as "platform", another lock, another build argument,
a key renamed, a hash computed another way) fails, naming the part.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import REPO

from halo.hashing import sha256_file, sha256_json, sha256_tree
from halo.images.catalog import load_catalog
from halo.images.catalog_types import Catalog
from halo.images.evaluate.bases import MAKE_CODE, recipe_definition
from halo.images.evaluate.derivations import (
    BUILDER_DOCKERFILE,
    BUILDER_SET,
    CUDA_HOME_CODE,
    image_derivations,
)
from halo.images.evaluate.plan import evaluate
from halo.images.graph import AMD64
from halo.images.wheel import backend_inputs
from halo.patching.source import fingerprint, source_patches
from halo.pins.lockfile import load_lock, lock_path
from halo.pins.source_pins import load_source_pins

RECORD = Path(__file__).parent / "data" / "plan_amd64_pinned.json"
Expect = Callable[[], object]  # what a moved part must be now: the digest of its file


def _record() -> dict[str, Any]:
    return json.loads(RECORD.read_text())


@pytest.fixture(autouse=True)
def _docker_builder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The record was made with the default builder kind (docker), as every plan is."""
    monkeypatch.delenv("HALO_BUILDER", raising=False)
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)


def settle(
    recorded: dict[str, Any], current: dict[str, Any], movers: dict[str, Expect], where: str
) -> dict[str, Any]:
    """``current`` with each moved part put back to its recorded value; fails on any other
    difference (a part added, dropped, or computed another way)."""
    assert sorted(current) == sorted(recorded), f"{where}: parts {sorted(current)} != record"
    out = dict(current)
    for key, value in current.items():
        if value == recorded[key]:
            continue
        assert key in movers, f"{where}.{key}: {value!r} != recorded {recorded[key]!r}"
        assert value == movers[key](), f"{where}.{key}: not the digest of what it covers"
        out[key] = recorded[key]
    return out


def settled_recipe(catalog: Catalog, name: str, record: dict[str, Any]) -> str:
    """The base's recipe hash with its moved files put back: must be the recorded one."""
    base = catalog.bases[name]
    current = recipe_definition(base, REPO)
    movers: dict[str, Expect] = {
        "os_lock_sha256": lambda: sha256_file(REPO / "pins" / f"debian.{name}.lock.toml"),
        "make_sha256": lambda: sha256_file(MAKE_CODE),
    }
    rec = record["bases"][name]
    settled = settle(rec["definition"], current, movers, f"bases.{name}")
    assert sha256_json(rec["definition"]) == rec["recipe"], "the record is inconsistent"
    assert sha256_json(settled) == rec["recipe"], f"bases.{name}: recipe computed another way"
    return sha256_json(current)


def settled_derivation(
    catalog: Catalog, image: str, drv: Any, recorded: dict[str, Any], record: dict[str, Any]
) -> dict[str, Any]:
    current = drv.inputs(REPO)
    builder = catalog.image(image).builder or catalog.image(image).base
    builder_lock = load_lock(lock_path(REPO / "pins", BUILDER_SET))
    tc_movers: dict[str, Expect] = {
        "host": lambda: {"base": "recipe:" + settled_recipe(catalog, builder, record)},
        # Every wheel of the platform's cuda-builder lock (pins/pylock.cuda-builder.toml).
        "requirements": lambda: sorted(
            f"{p.name}=={p.version} sha256:{next(a for a in p.artifacts if a.is_wheel).sha256}"
            for p in builder_lock.packages
        ),
    }
    recipe_movers: dict[str, Expect] = {
        "how": lambda: {"dockerfile": sha256_file(REPO / BUILDER_DOCKERFILE)},
        "cuda_home": lambda: sha256_file(REPO / CUDA_HOME_CODE),
    }
    where = f"images.{image}.derivations.{drv.name}"
    pin = {p.name: p for p in load_source_pins(REPO / "pins")}[drv.name]
    tc = settle(recorded["toolchain"], current["toolchain"], tc_movers, f"{where}.toolchain")
    rc = settle(recorded["recipe"], current["recipe"], recipe_movers, f"{where}.recipe")
    movers: dict[str, Expect] = {
        "toolchain": lambda: current["toolchain"],  # settled just above, part by part
        "recipe": lambda: current["recipe"],
        "patches": lambda: fingerprint(source_patches(REPO / "patches", pin.distribution)),
    }
    for key in ("version", "content", "subdirectory", "distribution"):  # pins/sources.toml
        movers[key] = lambda key=key: pin_parts(pin)[key]
    settled = settle(recorded, current, movers, where)
    return {**settled, "toolchain": tc, "recipe": rc}


def pin_parts(pin: Any) -> dict[str, object]:
    """The pin's own parts of a derivation's inputs (pins/sources.toml moved, not the code)."""
    return {
        "version": pin.version,
        "distribution": pin.distribution,
        "subdirectory": pin.subdirectory,
        "content": [
            {"path": "", "subdirectory": "", "sha256": pin.content_sha256},
            *(
                {"path": m.path, "subdirectory": m.subdirectory, "sha256": m.content_sha256}
                for m in pin.submodules
            ),
        ],
    }


def _image_movers(catalog: Catalog, name: str, record: dict[str, Any]) -> dict[str, Expect]:
    image = catalog.image(name)
    backend = backend_inputs(REPO)
    pins = {p.name: p for p in load_source_pins(REPO / "pins")}
    movers: dict[str, Expect] = {
        "halo_sha256": lambda: sha256_tree(REPO / "halo"),
        "lock_sha256": lambda: sha256_file(lock_path(REPO / "pins", image.pins)),
        "patches_sha256": lambda: sha256_tree(REPO / "patches"),
        "dockerfile_sha256": lambda: sha256_file(REPO / image.dockerfile),
        "image_dir_sha256": lambda: sha256_tree((REPO / image.dockerfile).parent),
        "sources": lambda: {n: dataclasses.asdict(pins[n]) for n in image.sources},
        "base": lambda: "recipe:" + settled_recipe(catalog, image.base, record),
    }
    if image.builder:
        movers["builder"] = lambda: "recipe:" + settled_recipe(catalog, image.builder, record)
    for key in ("pyproject_sha256", "readme_sha256", "halo_executables"):
        movers[key] = lambda key=key: backend[key]
    return movers


@pytest.mark.parametrize("name", sorted(_record()["images"]))
def test_amd64_input_hash_is_the_recorded_function_of_the_files(name: str) -> None:
    record = _record()
    recorded = record["images"][name]
    assert sha256_json(recorded["parts"]) == recorded["input_hash"], "the record is inconsistent"
    catalog = load_catalog(REPO)
    image = catalog.image(name)
    plan = evaluate(REPO, catalog, image, AMD64)
    current = plan.target.inputs
    assert plan.target.hash == sha256_json(current)

    movers = _image_movers(catalog, name, record)
    drvs = {d.name: d for d in image_derivations(REPO, catalog, image)}
    assert sorted(drvs) == sorted(recorded["derivations"])
    if drvs:
        settled_drvs = {}
        for drv_name, drv in drvs.items():
            rec = recorded["derivations"][drv_name]
            settled = settled_derivation(catalog, name, drv, rec["inputs"], record)
            assert sha256_json(settled) == rec["hash"], f"{name}.{drv_name}: hashed another way"
            settled_drvs[drv_name] = rec["hash"]
        now = {n: d.hash for n, d in ((d.name, d) for d in plan.derivations())}
        movers["derivations"] = lambda: now  # each one settled to its record just above
        assert now == {n: sha256_json(d.inputs(REPO)) for n, d in drvs.items()}
    settled = settle(recorded["parts"], current, movers, f"images.{name}")
    if drvs:
        settled["derivations"] = settled_drvs
    assert sha256_json(settled) == recorded["input_hash"], f"images.{name}: hashed another way"


def test_the_record_covers_every_amd64_image_of_the_catalog() -> None:
    """A new amd64 image needs no record; one that vanished from the catalog leaves it stale."""
    assert set(_record()["images"]) <= set(load_catalog(REPO).images)
