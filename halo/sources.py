"""Where artifacts may come from. Configuration only: nothing here names a host.

Indexes: $HALO_INDEX_URL, else the index pip/uv are configured with
($PIP_INDEX_URL, $UV_DEFAULT_INDEX, $UV_INDEX_URL), else pip's own built-in default.
Extra indexes: $HALO_EXTRA_INDEX_URLS (space separated).
Substitutes (local wheel folders, trusted only through the hash): $HALO_SUBSTITUTES
(os.pathsep separated), plus local folders named by $PIP_FIND_LINKS / $UV_FIND_LINKS.
"""

from __future__ import annotations

import os
from pathlib import Path

INDEX_VARS = ("HALO_INDEX_URL", "PIP_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL")
FIND_LINKS_VARS = ("PIP_FIND_LINKS", "UV_FIND_LINKS")


def _pip_default_index() -> str:
    # The default that pip itself ships with; asking pip keeps its location out of this repo.
    from pip._internal.models.index import PyPI

    return PyPI.simple_url


def index_urls(env: dict[str, str] | None = None) -> list[str]:
    env = dict(os.environ if env is None else env)
    primary = next((env[v] for v in INDEX_VARS if env.get(v)), None)
    urls = [primary or _pip_default_index()]
    urls += env.get("HALO_EXTRA_INDEX_URLS", "").split()
    return [u.rstrip("/") + "/" for u in urls if not u.startswith("file:")]


def substitute_dirs(env: dict[str, str] | None = None) -> list[Path]:
    env = dict(os.environ if env is None else env)
    dirs: list[str] = [d for d in env.get("HALO_SUBSTITUTES", "").split(os.pathsep) if d]
    for var in FIND_LINKS_VARS:
        for entry in env.get(var, "").replace(",", " ").split():
            if entry.startswith("file://"):
                entry = entry.removeprefix("file://")
            if "://" not in entry:
                dirs.append(entry)
    seen: list[Path] = []
    for d in dirs:
        p = Path(d)
        if p.is_dir() and p not in seen:
            seen.append(p)
    return seen
