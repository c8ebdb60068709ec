"""Who owns what a tier wrote: under `--user UID:GID` every output must be that user's.

Enroot and Apptainer run an image as the caller, so a file the tier leaves owned by anyone
else (a folder Docker made as root for a mount, a path written through a root helper) is
one the user cannot clean up or write again. The check walks scratch after the run and
names what changed since the run began and is not owned by the asked-for user.
"""

from __future__ import annotations

import os
from pathlib import Path


def parse_user(user: str) -> tuple[int, int | None]:
    """``UID[:GID]`` as numbers (names are the image's business, not the host's)."""
    uid, _, gid = user.partition(":")
    return int(uid), int(gid) if gid else None


def foreign_writes(root: Path, since_ns: int, uid: int, gid: int | None) -> list[Path]:
    """Paths under ``root`` changed at or after ``since_ns`` not owned by ``uid`` (and ``gid``)."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            path = Path(folder) / name
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue  # removed meanwhile: nothing left to own
            if max(st.st_mtime_ns, st.st_ctime_ns) < since_ns:
                continue
            if st.st_uid != uid or (gid is not None and st.st_gid != gid):
                found.append(path)
    return sorted(found)
