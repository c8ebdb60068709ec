"""The toolchain's own lock (pins/toolchain.txt): pinned, hash-checked, no index location.

`nox -s lock-check` re-resolves it against the index; this checks offline that it is the lock
of pyproject.toml's toolchain as written now (every exact pin at its version, every dependency
named) and that it names nothing of where packages come from.
"""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from support import REPO

LOCK = REPO / "pins" / "toolchain.txt"
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)")


def locked() -> dict[str, tuple[str, int]]:
    """name -> (version, number of sha256 hashes) from the requirements file."""
    out: dict[str, tuple[str, int]] = {}
    entry = None
    for line in LOCK.read_text().splitlines():
        if m := PIN.match(line):
            entry = canonicalize_name(m["name"])
            out[entry] = (m["version"], 0)
        elif entry and line.strip().startswith("--hash=sha256:"):
            version, n = out[entry]
            out[entry] = (version, n + 1)
    return out


def wanted() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    lines = [
        *project["project"]["dependencies"],
        *project["project"]["optional-dependencies"]["toolchain"],
        *project["dependency-groups"]["dev"],
    ]
    return [Requirement(line) for line in lines]


def test_the_lock_pins_pyprojects_toolchain_with_hashes() -> None:
    pins = locked()
    for req in wanted():
        version, hashes = pins[canonicalize_name(req.name)]
        assert req.specifier.contains(version), (req, version)
        assert hashes >= 1, req.name
    assert all(n >= 1 for _, n in pins.values())


def test_the_lock_names_no_index_or_host() -> None:
    text = LOCK.read_text()
    assert "://" not in text
    for option in ("--index-url", "--extra-index-url", "--find-links", "-i ", "-f "):
        assert not any(line.startswith(option) for line in text.splitlines()), option
