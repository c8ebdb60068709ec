"""The binary cache against a real OCI registry (HALO_TEST_REGISTRY, e.g. Debian's docker-registry).

A derivation is compiled once (a small C extension, natively, offline), pushed, and a fresh
store then realises it from the cache with no compile; entries that are tampered with,
unsigned, signed by a stranger or pinned to another digest are refused with one line.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import urllib.error
import urllib.request
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernels_support import (  # noqa: F401 - *_fixture: fixtures used by name
    DEMO_C,
    derivation,
    pin_for,
    realiser,
    small_native_fixture,
    store_with,
)
from support import REPO, halo

from halo.builder.record import DerivationRecord, read_record
from halo.builder.toolchain import Toolchain
from halo.cache.oci import RECORD_TYPE, WHEEL_TYPE, RegistryCache, tag
from halo.cache.trust import Trust
from halo.errors import HaloError
from halo.images.catalog import load_catalog
from halo.images.derivations import Derivation, image_derivations, realise
from halo.store.store import Store


def registry_or_skip() -> str:
    address = os.environ.get("HALO_TEST_REGISTRY", "")
    if not address:
        pytest.skip("needs a local OCI registry: set HALO_TEST_REGISTRY=127.0.0.1:5000")
    host, _, port = address.partition(":")
    try:
        socket.create_connection((host, int(port or 80)), timeout=2).close()
    except OSError as exc:
        pytest.skip(f"needs a local OCI registry at {address}: {exc}")
    return address


@pytest.fixture
def registry() -> Iterator[str]:
    """``HOST:PORT/kernels-test-XXXX``: this test's corner of the registry, emptied after."""
    address = registry_or_skip()
    prefix = f"kernels-test-{uuid.uuid4().hex[:8]}"
    yield f"{address}/{prefix}"
    base = f"http://{address}/v2/{prefix}/halo-derivations"
    accept = {"Accept": "application/vnd.oci.image.manifest.v1+json"}
    with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
        with urllib.request.urlopen(f"{base}/tags/list", timeout=10) as resp:
            tags = json.load(resp).get("tags") or []
        for t in tags:
            req = urllib.request.Request(f"{base}/manifests/{t}", method="HEAD", headers=accept)
            with urllib.request.urlopen(req, timeout=10) as resp:
                digest = resp.headers["Docker-Content-Digest"]
            with contextlib.suppress(urllib.error.HTTPError):
                urllib.request.urlopen(
                    urllib.request.Request(f"{base}/manifests/{digest}", method="DELETE"),
                    timeout=10,
                ).close()


def _keypair(folder: Path, name: str) -> tuple[Path, Path]:
    """An ed25519 key and an allowed-signers file trusting it as ``name``."""
    key = folder / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True
    )
    signers = folder / f"{name}.allowed"
    signers.write_text(f"{name} {(folder / f'{name}.pub').read_text()}")
    return key, signers


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    if subprocess.run(["ssh-keygen", "-?"], capture_output=True, check=False).returncode == 127:
        pytest.skip("needs OpenSSH's ssh-keygen for signed entries")
    folder = tmp_path / "keys"
    folder.mkdir()
    return {who: _keypair(folder, who) for who in ("halo-ci", "stranger")}


@pytest.fixture
def built(tmp_path: Path, small_native: Toolchain) -> tuple[Derivation, Store, str]:
    """demo-ext compiled once here: (its derivation, the store holding it, its hash)."""
    tc = small_native
    pin = pin_for(DEMO_C, "demo-ext", "halo-demo-ext")
    store = store_with(tmp_path / "built", tc, pin, DEMO_C)
    drv = derivation(pin, tc, DEMO_GREETING="cached")
    done = realise(drv, realiser(tmp_path / "a", store))
    assert done.origin == "built"
    return drv, store, done.hash


def test_a_pushed_derivation_is_pulled_and_used_by_a_fresh_store_with_no_compile(
    built: tuple[Derivation, Store, str],
    registry: str,
    keys: dict[str, tuple[Path, Path]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drv, store, drv_hash = built
    key, signers = keys["halo-ci"]
    record = read_record(store, drv_hash)
    assert record is not None
    pusher = RegistryCache(registry, Trust(signers=signers), signing_key=key)
    assert pusher.push(record, store).state == "pushed"
    assert pusher.push(record, store).state == "already there"  # entries are never rewritten

    # A fresh host: an empty store, no builder venv, no source; it must not compile.
    monkeypatch.setenv("HALO_BUILDERS", str(tmp_path / "no-builders"))
    fresh = Store(tmp_path / "fresh")
    r = realiser(tmp_path / "b", fresh, cache=RegistryCache(registry, Trust(signers=signers)))
    got = realise(drv, r)
    assert (got.origin, got.hash, got.sha256) == ("cache", drv_hash, record.sha256)
    assert not (tmp_path / "no-builders").exists() and not (fresh.root / "sources").exists()
    assert read_record(fresh, drv_hash) is not None  # recorded: the next realise is a store hit
    assert realise(drv, r).origin == "store"
    with zipfile.ZipFile(got.wheel) as zf:
        zf.extractall(tmp_path / "site")
    out = subprocess.run(
        ["python3", "-c", "import halo_demo_ext; print(halo_demo_ext.greet(3))"],
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.stdout.strip() == "cached 9", out.stderr


def _put(cache: RegistryCache, drv_hash: str, record: bytes, wheel: bytes, extra=()) -> None:  # type: ignore[no-untyped-def]
    """Write an entry by hand (what someone with push rights could do)."""
    import io

    from halo.registry.client import OCI_MANIFEST, Manifest, sha256_digest

    layers = []
    for media, data in ((WHEEL_TYPE, wheel), *extra):
        digest = sha256_digest(data)
        cache.client.upload_blob(cache.repo, digest, len(data), io.BytesIO(data))
        layers.append({"mediaType": media, "digest": digest, "size": len(data)})
    cdigest = sha256_digest(record)
    cache.client.upload_blob(cache.repo, cdigest, len(record), io.BytesIO(record))
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": RECORD_TYPE, "digest": cdigest, "size": len(record)},
        "layers": layers,
    }
    cache.client.put_manifest(
        cache.repo, tag(drv_hash), Manifest(json.dumps(doc).encode(), OCI_MANIFEST)
    )


def _refused(drv: Derivation, cache: RegistryCache, tmp: Path) -> str:
    with pytest.raises(HaloError) as err:
        realise(drv, realiser(tmp, Store(tmp / "store"), cache=cache))
    assert "\n" not in err.value.message
    assert not (tmp / "store" / "sha256").exists()  # nothing of the entry was kept
    return err.value.message


def test_tampered_unsigned_and_strangers_entries_are_refused(
    built: tuple[Derivation, Store, str],
    registry: str,
    keys: dict[str, tuple[Path, Path]],
    tmp_path: Path,
) -> None:
    drv, store, drv_hash = built
    key, signers = keys["halo-ci"]
    record = read_record(store, drv_hash)
    assert record is not None
    RegistryCache(registry, Trust(signers=signers), signing_key=key).push(record, store)
    reader = RegistryCache(registry, Trust(signers=signers))
    where = reader.where(drv_hash)

    # Another wheel, with a record that matches it: the signature no longer does.
    from halo.cache.trust import sign

    evil = b"PK\x05\x06" + b"\0" * 18  # an empty zip
    import hashlib

    forged = DerivationRecord(
        **{**record.model_dump(), "sha256": hashlib.sha256(evil).hexdigest(), "compile": None}
    )
    genuine_sig = sign(record.to_json().encode(), key)
    _put(
        reader,
        drv_hash,
        forged.to_json().encode(),
        evil,
        [("application/vnd.halo.derivation.signature.v1", genuine_sig)],
    )
    assert _refused(drv, reader, tmp_path / "t1") == (
        f"{where}: refused: not trusted: its signature is not by a key in {signers}"
    )

    # Signed by a key nobody trusts.
    stranger_key, _ = keys["stranger"]
    _put(
        reader,
        drv_hash,
        forged.to_json().encode(),
        evil,
        [
            (
                "application/vnd.halo.derivation.signature.v1",
                sign(forged.to_json().encode(), stranger_key),
            )
        ],
    )
    assert "its signature is not by a key in" in _refused(drv, reader, tmp_path / "t2")

    # The genuine, signed record, but its wheel layer swapped for other bytes.
    _put(
        reader,
        drv_hash,
        record.to_json().encode(),
        evil,
        [("application/vnd.halo.derivation.signature.v1", genuine_sig)],
    )
    assert _refused(drv, reader, tmp_path / "t3") == (
        f"{where}: refused: its wheel layer is not the recorded sha256 {record.sha256[:12]}"
    )

    # Unsigned, and no trust configured at all.
    _put(reader, drv_hash, forged.to_json().encode(), evil)
    assert _refused(drv, reader, tmp_path / "t4").endswith("not trusted: it carries no signature")
    assert _refused(drv, RegistryCache(registry, Trust()), tmp_path / "t5").endswith(
        "not trusted: no trust configured (HALO_CACHE_SIGNERS or HALO_CACHE_PINNED)"
    )

    # A record whose inputs are not this derivation's.
    other = DerivationRecord(**{**record.model_dump(), "inputs": {"name": "else"}, "compile": None})
    _put(reader, drv_hash, other.to_json().encode(), evil)
    assert "refused: its record is unusable" in _refused(drv, reader, tmp_path / "t6")


def test_a_pinned_digest_vouches_for_an_unsigned_entry(
    built: tuple[Derivation, Store, str], registry: str, tmp_path: Path
) -> None:
    drv, store, drv_hash = built
    record = read_record(store, drv_hash)
    assert record is not None
    RegistryCache(registry, Trust()).push(record, store)  # unsigned
    pinned = tmp_path / "pinned.toml"
    pinned.write_text(f'[derivations]\n"{drv_hash}" = "{"0" * 64}"\n')
    message = _refused(drv, RegistryCache(registry, Trust(pinned=pinned)), tmp_path / "p1")
    assert message.endswith(
        f"not trusted: {pinned} pins 000000000000, the entry holds {record.sha256[:12]}"
    )
    pinned.write_text(f'[derivations]\n"{drv_hash}" = "{record.sha256}"\n')
    r = realiser(
        tmp_path / "p2",
        Store(tmp_path / "p2" / "store"),
        cache=RegistryCache(registry, Trust(pinned=pinned)),
    )
    assert realise(drv, r).origin == "cache"


def test_cli_pull_refuses_a_forged_entry_with_one_line_and_plan_sees_the_cache(
    registry: str, keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """Through the CLI, for the catalog's own DeepEP derivation: an entry signed by a stranger
    is one error line (exit 2); the plan reports it as in the cache before anything is pulled."""
    catalog = load_catalog(REPO)
    (drv,) = [
        d
        for d in image_derivations(REPO, catalog, catalog.image("blackwell"))
        if d.name == "deep-ep"
    ]
    inputs = drv.inputs(REPO)
    from halo.hashing import sha256_json

    drv_hash = sha256_json(inputs)
    wheel = b"PK\x05\x06" + b"\0" * 18
    import hashlib

    record = DerivationRecord(
        name="deep-ep",
        hash=drv_hash,
        wheel="deep_ep-2.1.0-cp312-cp312-linux_x86_64.whl",
        sha256=hashlib.sha256(wheel).hexdigest(),
        inputs=inputs,
    )
    stranger, _ = keys["stranger"]
    _, signers = keys["halo-ci"]
    from halo.cache.trust import sign

    cache = RegistryCache(registry, Trust())
    _put(
        cache,
        drv_hash,
        record.to_json().encode(),
        wheel,
        [
            (
                "application/vnd.halo.derivation.signature.v1",
                sign(record.to_json().encode(), stranger),
            )
        ],
    )
    env = {
        "HALO_CACHE": registry,
        "HALO_CACHE_SIGNERS": str(signers),
        "HALO_STORE": str(tmp_path / "store"),
    }
    plan = halo("image", "plan", "blackwell", cwd=REPO, env=env)
    assert plan.returncode == 0, plan.stderr
    assert "in the cache: pulled, not compiled" in plan.stdout
    pulled = halo("cache", "pull", "blackwell", cwd=REPO, env=env)
    assert pulled.returncode == 2
    assert pulled.stderr.strip().splitlines() == [
        f"halo: error: {cache.where(drv_hash)}: refused: not trusted: its signature is not by a key in {signers}"
    ]
