"""Which file of a release the target image installs: the wheel its pip would pick.

Pure: given the candidate file names of one release and the target (CPython version,
manylinux level, arch), return the best wheel, or the sdist when no wheel fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

# The legacy manylinux names, each equal to a manylinux_2_N level.
LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def manylinux_platforms(glibc_minor: int, arch: str) -> list[str]:
    """Platform tags a glibc 2.<minor> system accepts, best (newest) first, as pip orders them."""
    out = []
    for minor in range(glibc_minor, 4, -1):
        out.append(f"manylinux_2_{minor}_{arch}")
        if minor in LEGACY_MANYLINUX:
            out.append(f"{LEGACY_MANYLINUX[minor]}_{arch}")
    return out


@cache
def tag_ranks(python: str, glibc_minor: int, arch: str) -> dict[Tag, int]:
    """Every tag the target interpreter installs, mapped to its priority (0 is best)."""
    version = tuple(int(p) for p in python.split("."))
    platforms = manylinux_platforms(glibc_minor, arch)
    tags = [
        *cpython_tags(version, platforms=platforms),
        *compatible_tags(version, interpreter=f"cp{version[0]}{version[1]}", platforms=platforms),
    ]
    ranks: dict[Tag, int] = {}
    for i, tag in enumerate(tags):
        ranks.setdefault(tag, i)
    return ranks


def wheel_rank(filename: str, ranks: dict[Tag, int]) -> int | None:
    """The best priority among a wheel's tags for this target; None when it does not install."""
    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    found = [ranks[t] for t in tags if t in ranks]
    return min(found) if found else None


def choose(
    wheels: Sequence[str], sdist: str | None, python: str, glibc_minor: int, arch: str
) -> str | None:
    """The file to install: the highest-priority compatible wheel, else the sdist, else None."""
    ranks = tag_ranks(python, glibc_minor, arch)
    ranked = [(r, w) for w in wheels if (r := wheel_rank(w, ranks)) is not None]
    if ranked:
        return min(ranked)[1]
    return sdist
