"""Source builds as derivations: compiled once through the real builder path, then reused."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support import REPO, docker_or_skip, halo, linked_store

from halo.hashing import sha256_tree
from halo.images.base import make_base
from halo.images.catalog import load_catalog
from halo.images.derivations import (
    Derivation,
    build_jobs,
    derivation_hash,
    realise,
    requirements_from,
)
from halo.pins.lockfile import load_lock

DEMO = REPO / "tests" / "toolchain" / "data" / "demo-ext"
GIB = 1 << 30


def test_build_jobs_fit_memory_not_just_cores() -> None:
    assert build_jobs(cores=64, mem_bytes=32 * GIB) == (4, 2)  # 4 GiB per nvcc thread
    assert build_jobs(cores=2, mem_bytes=24 * GIB) == (2, 1)
    assert build_jobs(cores=8, mem_bytes=2 * GIB) == (1, 1)


def _demo(builder_ref: str, builder_id: str, greeting: str = "hi") -> Derivation:
    lock = load_lock(REPO / "pins" / "pylock.cpu.toml")
    return Derivation(
        name="demo-ext",
        source=DEMO,
        content_sha256=sha256_tree(DEMO),
        subdirectory="",
        builder_ref=builder_ref,
        builder_id=builder_id,
        python="python3",
        requirements=requirements_from(lock.packages, ["pip", "setuptools"]),
        env=(("DEMO_GREETING", greeting),),
    )


def test_derivation_hash_covers_source_builder_env_and_deps_but_not_parallelism() -> None:
    base = _demo("b:1", "sha256:" + "1" * 64)
    h = derivation_hash(base, REPO)
    assert derivation_hash(_demo("b:1", "sha256:" + "2" * 64), REPO) != h
    assert derivation_hash(_demo("b:1", "sha256:" + "1" * 64, greeting="yo"), REPO) != h
    fewer = Derivation(**{**base.__dict__, "requirements": base.requirements[:1]})
    assert derivation_hash(fewer, REPO) != h
    other_src = Derivation(**{**base.__dict__, "content_sha256": "f" * 64})
    assert derivation_hash(other_src, REPO) != h


@pytest.mark.docker
def test_demo_extension_compiles_once_then_is_reused(tmp_path: Path) -> None:
    docker = docker_or_skip()
    catalog = load_catalog(REPO)
    builder = make_base(catalog.bases["debian12-build"], REPO, docker, tmp_path / "work")
    assert builder.image_id
    drv = _demo(builder.ref, builder.image_id)
    # The wheels the builder installs, linked from the real store.
    fetched = halo("fetch", "cpu", cwd=REPO)
    assert fetched.returncode == 0, fetched.stderr
    store = linked_store(tmp_path / "store", [art for _, _, art in drv.requirements])

    first = realise(drv, REPO, store, docker, tmp_path / "work")
    second = realise(drv, REPO, store, docker, tmp_path / "work")
    print(f"first: built={first.built} {first.wheel.name} sha256={first.sha256}")
    print(f"second: built={second.built} (cached under {second.hash[:12]})")
    assert first.built and not second.built
    assert (first.hash, first.sha256) == (second.hash, second.sha256)

    with zipfile.ZipFile(first.wheel) as zf:
        so = [n for n in zf.namelist() if n.endswith(".so")]
        assert so, "the wheel carries a compiled extension"
        zf.extractall(tmp_path / "site")
    run = subprocess.run(
        [sys.executable, "-c", "import halo_demo_ext; print(halo_demo_ext.greet(7))"],
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.stdout.strip() == "hi 49", run.stderr
