"""Test support for derivations: small real sources made in the test, real toolchains from locks.

Nothing here fakes a compiler: a "toolchain" is the locked wheels installed by the install
step (the cuda-builder set for CUDA sources, a few wheels of the cpu set for C sources),
and builds run natively in network-less namespaces or in Docker. What is missing on a host
(the set's CPython 3.11, namespaces, the wheels) is a skip that says so.
"""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path

import pytest
from support import REPO, halo, linked_store

from halo.builder.native import namespace_problem
from halo.builder.toolchain import Toolchain, native_toolchain
from halo.errors import HaloError
from halo.hashing import sha256_tree
from halo.images.catalog import load_catalog
from halo.images.derivations import Derivation, Realiser, derivation_env
from halo.pins.lockfile import load_lock
from halo.pins.source_pins import SourcePin
from halo.stack.interpreter import find_python
from halo.store.sources import tree_path
from halo.store.store import Store

DATA = REPO / "tests" / "toolchain" / "data"
DEMO_C = DATA / "demo-ext"
DEMO_CUDA = DATA / "demo-cuda-ext"
SMALL = ("pip", "setuptools", "packaging")  # what a C extension's builder needs


def namespaces_or_skip() -> None:
    if problem := namespace_problem():
        pytest.skip(f"needs network-less namespaces (unshare --net --mount, root): {problem}")


def python_or_skip(version: str) -> str:
    try:
        return find_python(version)[0]
    except HaloError as exc:
        pytest.skip(f"needs CPython {version}: {exc.message}")


def fetched_or_skip(set_name: str) -> None:
    """The set's wheels in the real store (the fetch phase: the package index)."""
    proc = halo("fetch", set_name, cwd=REPO)
    if proc.returncode != 0:
        pytest.skip(f"needs the {set_name} wheels in the store: {proc.stderr.strip()[-300:]}")


def small_toolchain() -> Toolchain:
    """pip, setuptools and packaging of the cpu set on its CPython: enough for a C extension."""
    lock = load_lock(REPO / "pins" / "pylock.cpu.toml")
    return native_toolchain(lock, python_or_skip(lock.python), SMALL)


def cuda_toolchain() -> Toolchain:
    """The cuda-builder set (nvcc, CUDA headers, torch) on its CPython (3.11), natively."""
    lock = load_lock(REPO / "pins" / "pylock.cuda-builder.toml")
    python = python_or_skip(lock.python)
    fetched_or_skip("cuda-builder")
    return native_toolchain(lock, python)


def pin_for(tree: Path, name: str, distribution: str, version: str = "1.0.0") -> SourcePin:
    """A source pin of a tree made here: content hash as `halo pins source-hash` computes it."""
    return SourcePin(
        name=name,
        distribution=distribution,
        version=version,
        repository="https://example.invalid/halo-test",  # never fetched: the tree is placed
        commit="0" * 40,
        content_sha256=sha256_tree(tree),
        sets=("cpu",),
    )


def store_with(dest: Path, tc: Toolchain, pin: SourcePin, tree: Path) -> Store:
    """A store holding the toolchain's wheels (linked from the real one) and the pin's tree."""
    store = linked_store(dest, [art for _, _, art in tc.requirements])
    shutil.copytree(tree, tree_path(store, pin))
    return store


def derivation(pin: SourcePin, tc: Toolchain, image: str = "hopper", **env: str) -> Derivation:
    """The derivation of ``pin`` as the catalog's ``image`` would build it (its arch list)."""
    base = dict(derivation_env(pin, load_catalog(REPO).image(image)))
    return Derivation(pin, tc, tuple(sorted({**base, **env}.items())), ())


def realiser(tmp: Path, store: Store, **kw: object) -> Realiser:
    return Realiser(repo=REPO, store=store, workdir=tmp / "work", keep_log=tmp / "logs", **kw)  # type: ignore[arg-type]


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text).lstrip())
    return root


def builders_env(tmp: Path) -> dict[str, str]:
    """Builder venvs where the developer keeps them ($HALO_BUILDERS), else under the test's tmp."""
    return {"HALO_BUILDERS": os.environ.get("HALO_BUILDERS") or str(tmp / "builders")}


@pytest.fixture(name="small_native")
def small_native_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Toolchain:
    """The C toolchain of the cpu set, for native builds in network-less namespaces."""
    namespaces_or_skip()
    fetched_or_skip("cpu")
    for k, v in builders_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    return small_toolchain()


@pytest.fixture(name="cuda_native")
def cuda_native_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Toolchain:
    """The cuda-builder toolchain (nvcc from the lock), for native builds."""
    namespaces_or_skip()
    for k, v in builders_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    return cuda_toolchain()
