"""Source trees and derivation outputs in the store are verified by hash every time they are used."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from halo.builder.record import read_record
from halo.errors import HaloError
from halo.hashing import sha256_json, sha256_tree
from halo.pins.source_pins import SourcePin, Submodule
from halo.store.sources import source_tree, tree_path, tree_problem
from halo.store.store import Store


def _tree(root: Path) -> Path:
    (root / "csrc" / "cutlass" / "include").mkdir(parents=True)
    (root / "setup.py").write_text("print('build')\n")
    (root / "csrc" / "kernel.cu").write_text("// kernel\n")
    (root / "csrc" / "cutlass" / "include" / "cutlass.h").write_text("// header\n")
    (root / "csrc" / "cutlass" / "README").write_text("not hashed: outside the subdirectory\n")
    return root


def _pin(tree: Path) -> SourcePin:
    return SourcePin(
        name="fa",
        distribution="fa",
        version="1",
        repository="http://127.0.0.1:9/nowhere",  # a re-fetch cannot succeed here
        commit="a" * 40,
        content_sha256=sha256_tree(tree, exclude=("csrc/cutlass/",)),
        sets=("cpu",),
        submodules=(
            Submodule(
                path="csrc/cutlass",
                repository="http://127.0.0.1:9/cutlass",
                commit="b" * 40,
                content_sha256=sha256_tree(tree / "csrc" / "cutlass" / "include"),
                subdirectory="include",
            ),
        ),
    )


def _stored(tmp_path: Path) -> tuple[Store, SourcePin, Path]:
    store = Store(tmp_path / "store")
    pin = _pin(_tree(tmp_path / "src"))
    final = tree_path(store, pin)
    final.parent.mkdir(parents=True)
    _tree(final)
    return store, pin, final


def test_an_intact_source_tree_is_used_as_it_is(tmp_path: Path) -> None:
    store, pin, final = _stored(tmp_path)
    assert tree_problem(pin, final) is None
    assert source_tree(pin, store, tmp_path / "work") == final
    (final / "csrc" / "cutlass" / "README").write_text("outside what the pin covers\n")
    assert tree_problem(pin, final) is None


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("csrc/kernel.cu", "fa: content hash "),
        ("csrc/cutlass/include/cutlass.h", "fa/csrc/cutlass:"),
    ],
)
def test_a_changed_source_tree_is_never_used(tmp_path: Path, path: str, expected: str) -> None:
    store, pin, final = _stored(tmp_path)
    (final / path).write_text("// edited after it was verified\n")
    problem = tree_problem(pin, final)
    assert problem is not None and problem.startswith(expected)
    # It is fetched again; here nothing answers, so the build stops instead of using it.
    with pytest.raises(HaloError, match=r"download failed"):
        source_tree(pin, store, tmp_path / "work")


WHEEL = "fa-1-cp311-cp311-linux_x86_64.whl"
INPUTS: dict[str, object] = {"source": "fa", "arch": "9.0"}
DRV = sha256_json(INPUTS)


def _record(store: Store, wheel: bytes) -> str:
    sha = hashlib.sha256(wheel).hexdigest()
    store.add_stream(sha, [wheel], WHEEL)
    folder = store.root / "derivations"
    folder.mkdir(parents=True, exist_ok=True)
    record = {"name": "fa", "hash": DRV, "wheel": WHEEL, "sha256": sha, "inputs": INPUTS}
    (folder / f"{DRV}.json").write_text(json.dumps(record))
    return DRV


def test_a_derivation_record_is_used_only_with_its_wheel_intact(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    drv_hash = _record(store, b"a compiled wheel")
    sha = hashlib.sha256(b"a compiled wheel").hexdigest()
    record = read_record(store, drv_hash)
    assert record is not None and (record.wheel, record.sha256) == (WHEEL, sha)
    wheel = store.path(sha)
    wheel.chmod(0o644)
    wheel.write_bytes(b"a compiled whEel")  # same size; the stamp no longer fits (mtime)
    assert read_record(store, drv_hash) is None, "a corrupted output means: build again"


@pytest.mark.parametrize(
    "record",
    [
        "{not json",
        json.dumps(
            {
                "name": "fa",
                "hash": DRV,
                "wheel": "../../x.whl",
                "sha256": "0" * 64,
                "inputs": INPUTS,
            }
        ),
        json.dumps(
            {
                "name": "fa",
                "hash": DRV,
                "wheel": WHEEL,
                "sha256": "../../etc/passwd",
                "inputs": INPUTS,
            }
        ),
        json.dumps(
            {
                "name": "fa",
                "hash": DRV,
                "wheel": WHEEL,
                "sha256": "0" * 64,
                "inputs": {"source": "another"},
            }
        ),
        '{"wheel": "x.whl"}',
        b"\xff\xfe not utf-8",
    ],
)
def test_an_unusable_derivation_record_means_build_again(
    tmp_path: Path, record: str | bytes
) -> None:
    store = Store(tmp_path / "store")
    drv_hash = _record(store, b"a compiled wheel")
    path = store.root / "derivations" / f"{drv_hash}.json"
    path.write_bytes(record if isinstance(record, bytes) else record.encode())
    assert read_record(store, drv_hash) is None
