"""The store keeps a byte only if its sha256 matches; fetch prefers store, substitutes, index."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from support import LocalIndex, halo, tree_listing

from halo.errors import HaloError
from halo.pins.lockfile import Artifact, Lock, Package
from halo.store.fetch import fetch_lock, summary
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
        f"halo: error: {repo_copy}/pins/sets.toml: unknown pin set 'gpu9000' (expected one of: blackwell, hopper, cuda-builder, vllm, sglang, cpu, vllm-cpu, cpu-arm64, blackwell-arm64, hopper-arm64, cuda-builder-arm64, vllm-arm64, sglang-arm64)"
    ]
    assert tree_listing(tmp_path / "store") == []


# --- keys, stamps, repair, truncation -----------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["../../../../etc/passwd", "A" * 64, "0" * 63, "0" * 64 + "/x", "", "g" * 64]
)
def test_the_store_refuses_any_key_that_is_not_64_hex(tmp_path: Path, key: str) -> None:
    store = Store(tmp_path / "store")
    with pytest.raises(HaloError, match=r"^store: refusing key .*: a sha256 is 64 lowercase hex"):
        store.path(key)
    with pytest.raises(HaloError, match=r"^store: refusing key"):
        store.add_stream(key, [b"x"], "x.whl")
    assert tree_listing(tmp_path) == []


def test_fetch_of_a_lock_with_a_path_as_sha256_writes_nothing(
    tmp_path: Path, local_index: LocalIndex
) -> None:
    data = b"payload"
    local_index.add("alpha", "alpha-1.0-py3-none-any.whl", data)
    evil = Artifact("alpha-1.0-py3-none-any.whl", "../../../../etc/passwd", len(data))
    lock = Lock("t", "3.11", "x86_64-manylinux_2_36", "0" * 64, (Package("alpha", "1.0", (evil,)),))
    with pytest.raises(HaloError, match=r"^store: refusing key '\.\./\.\./\.\./\.\./etc/passwd'"):
        fetch_lock(lock, Store(tmp_path / "store"), IndexClient([local_index.url]), [])
    assert tree_listing(tmp_path / "store") == []


def test_a_stamp_spares_the_hash_until_the_file_changes(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    sha = hashlib.sha256(b"payload").hexdigest()
    path = store.add_stream(sha, [b"payload"], "p.whl")
    assert store.check(sha) is None
    # Same size, mtime and inode, other bytes (what a stamp cannot see): trusted by the stamp,
    # caught by a re-hash, which `halo store verify` and a push always do.
    st = path.stat()
    path.chmod(0o644)
    with path.open("r+b") as fh:
        fh.write(b"P")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert store.check(sha) is None
    bad = store.check(sha, rehash=True)
    assert bad is not None and bad.actual == hashlib.sha256(b"Payload").hexdigest()
    # Any write that moves the mtime makes the stamp stale: hashed again, found corrupt.
    path.write_bytes(b"paylOad")
    assert store.check(sha) is not None


def test_fetch_repairs_a_corrupt_entry_and_says_so(tmp_path: Path, local_index: LocalIndex) -> None:
    good = b"A" * 5000
    local_index.add("alpha", "alpha-1.0-py3-none-any.whl", good)
    lock = _lock(("alpha", "", good))
    store = Store(tmp_path / "store")
    assert [r.origin for r in fetch_lock(lock, store, IndexClient([local_index.url]), [])] == [
        "index"
    ]
    path = store.path(lock.artifacts[0].sha256)
    path.chmod(0o644)
    path.write_bytes(b"A" * 4999 + b"B")
    results = fetch_lock(lock, store, IndexClient([local_index.url]), [])
    assert [r.origin for r in results] == ["repaired"]
    assert path.read_bytes() == good
    assert summary("t", results).splitlines()[0] == (
        "fetch t: every artifact verified by sha256; repaired 1 corrupt store entry: "
        "alpha-1.0-py3-none-any.whl"
    )


def test_a_corrupt_entry_without_a_source_names_the_command_that_fixes_it(tmp_path: Path) -> None:
    good = b"A" * 5000
    lock = _lock(("alpha", "", good))
    store = Store(tmp_path / "store")
    store.add_stream(lock.artifacts[0].sha256, [good], "a")
    store.path(lock.artifacts[0].sha256).chmod(0o644)
    store.path(lock.artifacts[0].sha256).write_bytes(b"B" * 5000)
    with pytest.raises(HaloError) as err:
        fetch_lock(lock, store, IndexClient(["http://127.0.0.1:9/simple/"]), [])
    assert err.value.message.startswith(
        "alpha-1.0-py3-none-any.whl: store entry corrupted and not replaced (alpha: index unreachable"
    )
    assert err.value.message.endswith("; run `halo fetch t` when a source has it")
    assert store.check(lock.artifacts[0].sha256) is not None, "still refused, still to repair"


def test_a_download_cut_short_says_so(tmp_path: Path, local_index: LocalIndex) -> None:
    data = b"C" * 100_000
    local_index.add("alpha", "alpha-1.0-py3-none-any.whl", data)
    local_index.cut_short["alpha-1.0-py3-none-any.whl"] = 40_000
    lock = _lock(("alpha", "", data))
    store = Store(tmp_path / "store")
    with pytest.raises(HaloError) as err:
        fetch_lock(lock, store, IndexClient([local_index.url]), [])
    assert err.value.message == (
        "alpha-1.0-py3-none-any.whl: download cut short: got 40000 of 100000 bytes; not kept"
    )
    assert not store.has(lock.artifacts[0].sha256)
    assert list(store.partials()) == []


# --- halo store verify / gc -----------------------------------------------------------------------


def _cpu_artifact(repo: Path, prefix: str) -> Artifact:
    """An artifact of the cpu lock that the session's store holds (CI fetches cpu first)."""
    from halo.pins.lockfile import load_lock, lock_path

    art = next(
        a for a in load_lock(lock_path(repo / "pins", "cpu")).artifacts if a.file.startswith(prefix)
    )
    if not Store(store_root_of_session()).has(art.sha256):
        pytest.skip(f"needs {art.file} in the store: run `halo fetch cpu`")
    return art


def test_store_verify_finds_and_repairs_a_corrupt_entry(
    repo_copy: Path, tmp_path: Path, local_index: LocalIndex
) -> None:
    from support import linked_store

    art = _cpu_artifact(repo_copy, "iniconfig-")
    real = Store(store_root_of_session())
    local_index.add("iniconfig", art.file, real.path(art.sha256).read_bytes())
    copy = linked_store(tmp_path / "store", [art])
    victim = copy.path(art.sha256)
    data = bytearray(victim.read_bytes())
    data[100] ^= 1
    victim.unlink()
    victim.write_bytes(bytes(data))
    env = {"HALO_STORE": str(copy.root), "HALO_INDEX_URL": local_index.url, "HALO_SUBSTITUTES": ""}
    env |= {"PIP_FIND_LINKS": "", "UV_FIND_LINKS": "", "PIP_CONFIG_FILE": "/dev/null"}
    found = halo("store", "verify", cwd=repo_copy, env=env)
    assert found.returncode == 1, found.stderr
    assert found.stderr.strip().splitlines() == [
        "halo: 1 corrupt store entry; run `halo store verify --repair`"
    ]
    fixed = halo("store", "verify", "--repair", cwd=repo_copy, env=env)
    assert fixed.returncode == 0, fixed.stderr
    assert f"repaired: {art.file}" in fixed.stdout
    assert copy.check(art.sha256, rehash=True) is None
    assert real.check(art.sha256, rehash=True) is None, "the shared store was never touched"


def store_root_of_session() -> Path:
    from halo.paths import store_root

    return store_root()


def test_store_gc_drops_dead_partials_and_unnamed_entries_only(
    repo_copy: Path, tmp_path: Path
) -> None:
    import fcntl
    import json

    from support import linked_store

    named = _cpu_artifact(repo_copy, "iniconfig-")
    store = linked_store(tmp_path / "store", [named])
    orphan = hashlib.sha256(b"orphan").hexdigest()
    store.add_stream(orphan, [b"orphan"], "orphan")
    built = hashlib.sha256(b"a derivation's wheel").hexdigest()
    store.add_stream(built, [b"a derivation's wheel"], "wheel")
    (store.root / "derivations").mkdir()
    (store.root / "derivations" / ("d" * 64 + ".json")).write_text(json.dumps({"sha256": built}))
    dead = store.root / "sha256" / "ab" / ".incoming.dead"
    dead.parent.mkdir(parents=True, exist_ok=True)
    dead.write_bytes(b"half a wheel")
    alive = store.root / "sha256" / "ab" / ".incoming.alive"
    alive.write_bytes(b"being written")
    env = {"HALO_STORE": str(store.root)}
    with alive.open("rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # a fetch still writing it
        dry = halo("store", "gc", "--dry-run", cwd=repo_copy, env=env)
        assert dry.returncode == 0, dry.stderr
        assert dead.exists() and store.has(orphan)
        proc = halo("store", "gc", cwd=repo_copy, env=env)
    assert proc.returncode == 0, proc.stderr
    assert not dead.exists() and alive.exists()
    assert not store.has(orphan) and not (store.root / "verified" / orphan).exists()
    assert store.has(named.sha256) and store.has(built)
    assert "entries no lock or derivation names  1" in proc.stdout
