"""The stage's layer compression: ISA-L's gzip at level 1, the same bytes every time, and a
stream that every registry client (Python's gzip here, docker and containerd on a pull)
reads back to the layer whose sha256 is the image's diff ID."""

from __future__ import annotations

import gzip
import hashlib
import io
import random
import tarfile
from pathlib import Path

from halo.registry.transfer import _compress


def _layer() -> bytes:
    """A tar of 8 MiB as a layer holds: text that compresses, and bytes that do not."""
    rng = random.Random(7)
    words = [bytes(rng.choices(b"abcdefghij_.(): ", k=rng.randint(2, 9))) for _ in range(400)]
    text = b" ".join(rng.choice(words) for _ in range(700_000))[: 6 << 20]
    noise = rng.randbytes(2 << 20)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("opt/venv/lib/module.py", text), ("opt/venv/lib/lib.so", noise)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1793491200, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_layer_compresses_to_the_same_bytes_twice_and_reads_back(tmp_path: Path) -> None:
    layer = _layer()
    first, second = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
    diff_id, digest, size = _compress(io.BytesIO(layer), first)
    assert _compress(io.BytesIO(layer), second) == (diff_id, digest, size)
    blob = first.read_bytes()
    assert blob == second.read_bytes()
    assert diff_id == "sha256:" + hashlib.sha256(layer).hexdigest()
    assert digest == "sha256:" + hashlib.sha256(blob).hexdigest() and size == len(blob)
    assert gzip.decompress(blob) == layer
    # The header names no file and no time (FLG 0, MTIME 0): nothing of this machine or now.
    assert blob[:3] == b"\x1f\x8b\x08" and blob[3] == 0 and blob[4:8] == b"\0\0\0\0"
    assert size < 0.7 * len(layer)


class _Pipe(io.RawIOBase):
    """Reads as a pipe does: whatever has arrived, here 1 to 300,000 bytes at a time."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at, self.rng = data, 0, random.Random(3)

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        size = min(n if n >= 0 else len(self.data), self.rng.randint(1, 300_000))
        out = self.data[self.at : self.at + size]
        self.at += len(out)
        return out


def test_the_bytes_do_not_depend_on_how_the_source_reads(tmp_path: Path) -> None:
    """ISA-L's output changes with how its input is cut; a pipe's reads must not change it."""
    layer = _layer()
    whole = _compress(io.BytesIO(layer), tmp_path / "whole.gz")
    assert _compress(_Pipe(layer), tmp_path / "pipe.gz") == whole  # type: ignore[arg-type]


def test_the_compressor_is_isa_l_at_level_1(tmp_path: Path) -> None:
    """Pinned by the bytes: zlib (at any level) gives other ones, and a change of compressor
    changes every staged digest, so it is made here on purpose."""
    from isal import isal_zlib

    layer = _layer()
    _compress(io.BytesIO(layer), tmp_path / "l.tar.gz")
    body = (tmp_path / "l.tar.gz").read_bytes()[10:-8]  # the raw deflate stream
    deflate = isal_zlib.compressobj(1, isal_zlib.DEFLATED, -15)
    pieces = [deflate.compress(layer[i : i + (1 << 20)]) for i in range(0, len(layer), 1 << 20)]
    assert body == b"".join(pieces) + deflate.flush()
    for level in range(1, 10):
        assert gzip.compress(layer, compresslevel=level, mtime=0)[10:-8] != body, level
