"""Find installed distributions in a site directory, without importing them.

The packages patched here (SGLang, vLLM, ...) do not import without a GPU stack, so a
distribution is found through its metadata (``importlib.metadata`` on the folder) and its
files through its RECORD.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name

from halo.errors import HaloError


def default_site() -> Path:
    """The running interpreter's purelib: where `pip install` put the packages."""
    return Path(sysconfig.get_paths()["purelib"])


def site_dir(explicit: Path | None) -> Path:
    site = explicit or default_site()
    if not site.is_dir():
        raise HaloError(f"{site}: --site: expected an existing site-packages directory")
    return site


@dataclass(frozen=True)
class Installed:
    name: str
    version: str
    files: frozenset[str]

    def owns(self, relpath: str) -> bool:
        # A RECORD-less install (rare, hand-made) cannot prove ownership; trust the path then.
        return not self.files or relpath in self.files


def find_distribution(site: Path, name: str) -> Installed | None:
    wanted = canonicalize_name(name)
    for dist in metadata.distributions(name=name, path=[str(site)]):
        found = dist.metadata["Name"] or ""
        if canonicalize_name(found) != wanted or not dist.version:
            continue
        files = frozenset(f.as_posix() for f in dist.files or ())
        return Installed(found, dist.version, files)
    return None
