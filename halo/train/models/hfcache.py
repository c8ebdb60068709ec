"""`halo hf-cache seed LIST`: fill the Hugging Face cache with pinned files, verified by hash.

LIST is a TOML file naming, per model, a Hub id, a commit and the sha256 of each file::

    [[model]]
    id = "halo-examples/tiny-llama"
    revision = "0123...ef"            # 40 hex digits: the commit the files are pinned to
    local = "../examples/models/tiny-llama"   # optional folder to copy from (relative to LIST)
    files = {"config.json" = "<sha256>", "tokenizer.json" = "<sha256>"}

A file comes from ``--from DIR`` (``DIR/<id>/<file>``), else the entry's ``local`` folder,
else the Hub (through huggingface_hub). It is placed in the cache only when its sha256
matches, as ``$HF_HOME/hub/models--<org>--<name>/snapshots/<revision>/<file>`` with
``refs/main`` naming the revision: the layout transformers reads with local_files_only.
A file already there with the right hash is left alone.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from halo import atomic, schema
from halo.confine import inside, name_problem
from halo.errors import HaloError
from halo.hashing import sha256_file

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")]
    revision: Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")]
    local: str | None = None
    files: dict[str, Sha256]


class SeedList(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: list[Entry]


@dataclass(frozen=True)
class Placed:
    id: str
    file: str
    source: str  # "cached", "local", "from", "hub"


def hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(home) / "hub"


def snapshot(cache: Path, entry: Entry) -> Path:
    return cache / f"models--{entry.id.replace('/', '--')}" / "snapshots" / entry.revision


def _from_hub(entry: Entry, name: str, tmp: Path) -> Path:
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise HaloError(
            f"{entry.id}/{name}: not local, and huggingface_hub is not installed"
        ) from None
    try:
        return Path(hf_hub_download(entry.id, name, revision=entry.revision, cache_dir=str(tmp)))
    except Exception as exc:  # network, auth, missing file: one line either way
        raise HaloError(
            f"{entry.id}/{name}: cannot download ({' '.join(str(exc).split())[:200]}); "
            "give a local copy with --from DIR"
        ) from None


def _planned(spec: SeedList, list_path: Path, cache: Path) -> list[list[tuple[str, str, Path]]]:
    """Per entry, every (file, sha256, destination), each name confined to the cache: a list
    from elsewhere must not write outside it (``../../.bashrc``). All are checked before any
    is written.
    """
    out = []
    for i, entry in enumerate(spec.model):
        where = f"{list_path}: model[{i}] ({entry.id}): files"
        for name in entry.files:
            if why := name_problem(name):
                raise HaloError(
                    f"{where}: {name!r}: {why}; refused (names are relative to the snapshot)"
                )
        snap = snapshot(cache, entry).relative_to(cache).as_posix()
        # Confined to the cache, not the snapshot: Hugging Face's own snapshots hold links
        # into the cache's blobs/, and a file already placed may be one.
        out.append([(n, d, inside(cache, n, where, snap)) for n, d in sorted(entry.files.items())])
    return out


def seed(list_path: Path, source: Path | None, cache: Path) -> list[Placed]:
    spec = schema.validate(SeedList, schema.read_toml(list_path), str(list_path))
    placed = []
    for entry, files in zip(spec.model, _planned(spec, list_path, cache), strict=True):
        for name, digest, dest in files:
            if dest.is_file() and sha256_file(dest) == digest:
                placed.append(Placed(entry.id, name, "cached"))
                continue
            with tempfile.TemporaryDirectory(prefix="halo-hf-") as tmp:
                if source is not None and (source / entry.id / name).is_file():
                    got, how = source / entry.id / name, "from"
                elif entry.local is not None:
                    got, how = (list_path.parent / entry.local / name).resolve(), "local"
                    if not got.is_file():
                        raise HaloError(f"{list_path}: {entry.id}: {got} not found")
                else:
                    got, how = _from_hub(entry, name, Path(tmp)), "hub"
                actual = sha256_file(got)
                if actual != digest:
                    raise HaloError(
                        f"{entry.id}/{name}: sha256 {actual} from {how}, expected {digest}; "
                        "not placed in the cache"
                    )
                atomic.write_bytes(dest, got.read_bytes())
            placed.append(Placed(entry.id, name, how))
        atomic.write_text(snapshot(cache, entry).parent.parent / "refs" / "main", entry.revision)
    return placed


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hf-cache", help="fill the Hugging Face cache (HF_HOME) from a pinned list")
    q = p.add_subparsers(dest="hf_cache_command", metavar="ACTION", required=True)
    s = q.add_parser(
        "seed",
        help="place every file of LIST in the cache, each verified by its sha256",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    s.add_argument("list", type=Path, help="TOML list of models, revisions and file hashes")
    s.add_argument("--from", dest="source", type=Path, help="folder with <id>/<file> copies")
    s.add_argument("--cache", type=Path, help="hub cache folder (default: $HF_HOME/hub)")
    s.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    from halo.report import table

    cache = args.cache or hub_cache()
    placed = seed(args.list, args.source, cache)
    print(table(["model", "file", "source"], [[p.id, p.file, p.source] for p in placed]))
    print(f"hf-cache: {len(placed)} files verified in {cache}")
    return 0


def files_of(folder: Path) -> dict[str, str]:
    """The ``files`` table for a folder: every file with its sha256 (for writing a LIST)."""
    return {
        str(p.relative_to(folder)): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()
    }
