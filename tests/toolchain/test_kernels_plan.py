"""`halo image plan`: per derivation, in the store, in the cache, or what compiling costs here."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from support import REPO

from halo.builder.record import Compile, DerivationRecord, write_record
from halo.hashing import sha256_json
from halo.images.catalog import load_catalog
from halo.images.derivations import image_derivations
from halo.images.estimate import CacheProbe, compile_estimate, where
from halo.images.plan import derivation_rows
from halo.store.store import Store


def _realised(store: Store, drv, seconds: float) -> str:  # type: ignore[no-untyped-def]
    """Put a record and its wheel for ``drv`` into ``store``, as a build would."""
    wheel = b"PK\x05\x06" + b"\0" * 18
    sha = hashlib.sha256(wheel).hexdigest()
    store.add_stream(sha, [wheel], "wheel")
    inputs = drv.inputs(REPO)
    record = DerivationRecord(
        name=drv.name,
        hash=sha256_json(inputs),
        wheel=f"{drv.pin.distribution}-{drv.pin.version}-cp312-cp312-linux_x86_64.whl",
        sha256=sha,
        inputs=inputs,
        compile=Compile(seconds=seconds, jobs=2, cores=2),
    )
    write_record(store, record)
    return record.hash


def test_rows_say_store_or_an_estimate_from_this_hosts_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HALO_CACHE", "off")
    monkeypatch.setenv("MAX_JOBS", "2")
    catalog = load_catalog(REPO)
    image = catalog.image("blackwell")
    store = Store(tmp_path / "store")
    drvs = {d.name: d for d in image_derivations(REPO, catalog, image)}
    _realised(store, drvs["deep-ep"], seconds=320.0)
    rows = {r[0]: r for r in derivation_rows(REPO, catalog, image, store, None)}
    assert rows["deep-ep"][4].startswith("in the store (deep_ep-2.1.0-")
    assert rows["flash-attn"][4] == (
        "must compile: ~4.0 h at MAX_JOBS=2 (estimate): leave it to a host with the cores"
    )
    assert rows["flash-attn"][2] == "10.0"
    # The same source for another image: not in the store, but its compile time is known now.
    hopper = {d.name: d for d in image_derivations(REPO, catalog, catalog.image("hopper"))}
    assert (
        compile_estimate(hopper["deep-ep"], store)
        == "must compile: ~5 min at MAX_JOBS=2 (measured)"
    )
    monkeypatch.setenv("MAX_JOBS", "64")  # a host with the cores
    assert (
        compile_estimate(hopper["flash-attn"], store)
        == "must compile: ~8 min at MAX_JOBS=64 (estimate)"
    )


def test_a_cache_that_does_not_answer_is_reported_once_not_fatal(tmp_path: Path) -> None:
    class Down:
        def has(self, drv_hash: str) -> bool:
            from halo.errors import HaloError

            raise HaloError("127.0.0.1:9: registry did not answer")

    probe = CacheProbe(Down())  # type: ignore[arg-type]
    assert where("a" * 64, Store(tmp_path), probe) is None
    assert where("b" * 64, Store(tmp_path), probe) is None
    assert probe.problem == "127.0.0.1:9: registry did not answer"
