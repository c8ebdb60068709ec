"""Test support: a site directory made from the members of an upstream wheel, for proving patches.

The wheel is the exact release (``pip download --no-deps`` from the configured index,
cached); only the members a patch needs, plus the dist-info METADATA and RECORD, are
extracted, so the engine sees what an installed release looks like.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from halo.errors import HaloError
from halo.paths import cache_home
from halo.pins.artifacts import manylinux_platforms

# The images run CPython 3.11 on glibc 2.36 x86_64 (Debian 12); fetch the wheels they would install.
# pip takes --platform literally, so every manylinux tag that glibc accepts is listed, in the
# order the lock's own wheel choice (halo.pins.artifacts) ranks them.
TARGET = (
    "--python-version",
    "3.11",
    *(arg for tag in manylinux_platforms(36, "x86_64") for arg in ("--platform", tag)),
    "--only-binary",
    ":all:",
)


def wheel_cache() -> Path:
    return Path(os.environ.get("HALO_TEST_CACHE") or cache_home() / "test-wheels")


def _dist_stem(name: str) -> str:
    return name.replace("-", "_").lower()


def download_wheel(name: str, version: str, cache: Path | None = None) -> Path:
    """The wheel of ``name==version``, downloaded once into the cache."""
    folder = (cache or wheel_cache()) / f"{_dist_stem(name)}-{version}"
    found = sorted(folder.glob("*.whl"))
    if found:
        return found[0]
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        *TARGET,
        "-d",
        str(staging),
        f"{name}=={version}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(staging.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise HaloError(f"{name}=={version}: pip download failed: {tail[0]}")
    if folder.exists():  # another process finished first; its copy is as good as ours
        shutil.rmtree(staging)
    else:
        staging.replace(folder)
    return sorted(folder.glob("*.whl"))[0]


def extract_members(wheel: Path, members: list[str] | None, dest: Path) -> Path:
    """Copy ``members`` (None: every file) and the dist-info METADATA/RECORD into ``dest``."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        dist_info = {
            n for n in names if n.count("/") == 1 and n.split("/")[0].endswith(".dist-info")
        }
        wanted = [m for m in dist_info if m.endswith(("/METADATA", "/RECORD"))]
        wanted += sorted(n for n in names if not n.endswith("/")) if members is None else members
        for member in wanted:
            if member not in names:
                raise HaloError(f"{wheel.name}: {member}: not a member of this wheel")
            if ".." in Path(member).parts or member.startswith("/"):
                raise HaloError(f"{wheel.name}: {member}: member escapes the site directory")
            target = dest / member
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(member))
            if member.endswith(".so"):
                target.chmod(0o755)
            else:
                target.chmod(0o644)
    return dest


def release_site(name: str, version: str, members: list[str] | None, dest: Path) -> Path:
    return extract_members(download_wheel(name, version), members, dest)
