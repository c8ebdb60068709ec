"""Content hashes: files, trees and canonical JSON."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def sha256_json(obj: Any) -> str:
    return sha256_bytes(canonical_json(obj))


IGNORED_PARTS = frozenset({"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"})


def tree_files(
    root: Path, suffixes: tuple[str, ...] = (), exclude: tuple[str, ...] = ()
) -> list[Path]:
    """Files under ``root`` in a stable order, skipping caches, bytecode and the folders
    ``exclude`` names (relative, ending in "/")."""
    out = []
    for path in root.rglob("*"):
        if not path.is_file() or IGNORED_PARTS.intersection(path.relative_to(root).parts):
            continue
        if exclude and path.relative_to(root).as_posix().startswith(exclude):
            continue
        if path.suffix in {".pyc", ".pyo"}:
            continue
        if suffixes and path.suffix not in suffixes:
            continue
        out.append(path)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def sha256_tree(root: Path, suffixes: tuple[str, ...] = (), exclude: tuple[str, ...] = ()) -> str:
    """Hash of relative paths and contents; independent of mtimes and of the checkout's location."""
    h = hashlib.sha256()
    for path in tree_files(root, suffixes, exclude):
        rel = path.relative_to(root).as_posix().encode()
        h.update(len(rel).to_bytes(4, "big") + rel)
        h.update(bytes.fromhex(sha256_file(path)))
    return h.hexdigest()
