"""The store keeps a byte only if its sha256 matches; fetch prefers store, substitutes, index."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from support import LocalIndex, halo, tree_listing

from halo.errors import HaloError
from halo.pins.lockfile import Artifact, Lock, Package
from halo.store.fetch import fetch_lock
from halo.store.index import IndexClient
from halo.store.store import Store


def _lock(*packages: tuple[str, str, bytes]) -> Lock:
    pkgs = tuple(
        Package(
            name,
            "1.0",
            (
                Artifact(
                    f"{name}-1.0-py3-none-any.whl", hashlib.sha256(data).hexdigest(), len(data)
                ),
            ),
        )
        for name, _, data in packages
    )
    return Lock("t", "3.11", "x86_64-manylinux_2_36", "0" * 64, pkgs)


def test_store_refuses_bytes_that_do_not_match_and_keeps_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    expected = hashlib.sha256(b"right").hexdigest()
    with pytest.raises(HaloError) as err:
        store.add_stream(expected, [b"wrong"], "demo-1.0.whl")
    assert str(err.value) == (
        f"demo-1.0.whl: sha256 mismatch: expected {expected}, got {hashlib.sha256(b'wrong').hexdigest()}; not kept"
    )
    assert [p for p in tree_listing(store.root) if "sha256/" in p and len(p.split("/")) == 3] == []
    assert not store.has(expected)


def test_store_verify_detects_a_flipped_byte(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    sha = hashlib.sha256(b"payload").hexdigest()
    path = store.add_stream(sha, [b"payload"], "p.whl")
    path.chmod(0o644)
    path.write_bytes(b"paylOad")
    with pytest.raises(HaloError, match=r"^p\.whl: store entry corrupted: expected sha256 "):
        store.verify(sha, "p.whl")


def test_fetch_downloads_from_a_real_http_index_then_nothing(
    tmp_path: Path, local_index: LocalIndex
) -> None:
    data_a, data_b = b"A" * 5000, b"B" * 7000
    local_index.add("alpha", "alpha-1.0-py3-none-any.whl", data_a)
    local_index.add("beta", "beta-1.0-py3-none-any.whl", data_b)
    lock = _lock(("alpha", "", data_a), ("beta", "", data_b))
    store = Store(tmp_path / "store")
    first = fetch_lock(lock, store, IndexClient([local_index.url]), [])
    assert [r.origin for r in first] == ["index", "index"]
    second = fetch_lock(lock, store, IndexClient(["http://127.0.0.1:9/unused/"]), [])
    assert [r.origin for r in second] == ["store", "store"]


def test_fetch_refuses_a_tampered_download(tmp_path: Path, local_index: LocalIndex) -> None:
    good = b"good bytes"
    lock = _lock(("alpha", "", good))
    # The index serves other bytes under the same name (and lists their honest hash).
    local_index.add(
        "alpha",
        "alpha-1.0-py3-none-any.whl",
        b"evil bytes",
        listed_sha256=hashlib.sha256(good).hexdigest(),
    )
    store = Store(tmp_path / "store")
    with pytest.raises(
        HaloError,
        match=r"^alpha-1\.0-py3-none-any\.whl: sha256 mismatch: expected [0-9a-f]{64}, got [0-9a-f]{64}; not kept$",
    ):
        fetch_lock(lock, store, IndexClient([local_index.url]), [])
    assert not store.has(lock.artifacts[0].sha256)


def test_substitute_accepted_only_through_the_hash(tmp_path: Path, local_index: LocalIndex) -> None:
    good = b"the real wheel"
    lock = _lock(("alpha", "", good))
    bad_dir, good_dir = tmp_path / "bad", tmp_path / "good"
    bad_dir.mkdir()
    good_dir.mkdir()
    (bad_dir / "alpha-1.0-py3-none-any.whl").write_bytes(b"an impostor")
    (good_dir / "alpha-1.0-py3-none-any.whl").write_bytes(good)
    store = Store(tmp_path / "store")
    results = fetch_lock(lock, store, IndexClient([local_index.url]), [bad_dir, good_dir])
    assert [r.origin for r in results] == ["substitute"]
    assert store.verify(lock.artifacts[0].sha256, "alpha").read_bytes() == good


def test_fetch_names_an_artifact_no_source_has(tmp_path: Path, local_index: LocalIndex) -> None:
    lock = _lock(("ghost", "", b"nowhere"))
    with pytest.raises(
        HaloError, match=r"^ghost-1\.0-py3-none-any\.whl: not found on the configured index"
    ):
        fetch_lock(lock, Store(tmp_path / "store"), IndexClient([local_index.url]), [])


def test_fetch_of_an_unknown_set_is_one_line_exit_2(
    repo_copy: Path, isolated_env: dict[str, str], tmp_path: Path
) -> None:
    proc = halo("fetch", "cpu", "gpu9000", cwd=repo_copy, env=isolated_env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"halo: error: {repo_copy}/pins/sets.toml: unknown pin set 'gpu9000' (expected one of: blackwell, hopper, cuda-builder, vllm, sglang, cpu, vllm-cpu)"
    ]
    assert tree_listing(tmp_path / "store") == []
