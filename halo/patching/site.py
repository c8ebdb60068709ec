"""Read installed distributions straight from a site directory, without importing them.

The packages patched here (SGLang, vLLM, ...) do not import without a GPU stack, so a
distribution is found by its ``*.dist-info/METADATA`` and its files by ``RECORD``.
"""

from __future__ import annotations

import csv
import re
import sysconfig
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from halo.errors import HaloError


def default_site() -> Path:
    """The running interpreter's purelib: where `pip install` put the packages."""
    return Path(sysconfig.get_paths()["purelib"])


def site_dir(explicit: Path | None) -> Path:
    site = explicit or default_site()
    if not site.is_dir():
        raise HaloError(f"{site}: --site: expected an existing site-packages directory")
    return site


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Installed:
    name: str
    version: str
    dist_info: Path
    files: frozenset[str]

    def owns(self, relpath: str) -> bool:
        # A RECORD-less install (rare, hand-made) cannot prove ownership; trust the path then.
        return not self.files or relpath in self.files


def _record_files(dist_info: Path) -> frozenset[str]:
    record = dist_info / "RECORD"
    if not record.is_file():
        return frozenset()
    with record.open(newline="", encoding="utf-8") as fh:
        return frozenset(row[0] for row in csv.reader(fh) if row)


def find_distribution(site: Path, name: str) -> Installed | None:
    wanted = normalize(name)
    # dist-info folder names are normalised with underscores; match loosely, then confirm by METADATA.
    for dist_info in sorted(site.glob("*.dist-info")):
        if normalize(dist_info.name.removesuffix(".dist-info").rsplit("-", 1)[0]) != wanted:
            continue
        metadata = dist_info / "METADATA"
        if not metadata.is_file():
            continue
        headers = HeaderParser().parsestr(metadata.read_text(encoding="utf-8", errors="replace"))
        if normalize(headers.get("Name", "")) != wanted or not headers.get("Version"):
            continue
        return Installed(headers["Name"], headers["Version"], dist_info, _record_files(dist_info))
    return None
