"""Names read from files a user did not write become paths only through here.

A seed list, a lock, a checkpoint's ``meta.json`` or an archive names files relative to a
folder. Such a name is refused, in one line and before anything is written, when it is
absolute, holds ``..``, is empty, or resolves (through a symlink already on disk) to a place
outside its folder. Joining a name and a folder anywhere else is how files land outside the
cache (``../../.bashrc``): call :func:`inside` instead of ``folder / name``.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from halo.errors import HaloError


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a file below a folder (lexically), or None."""
    if not isinstance(name, str) or not name:
        return "an empty name"
    if "\x00" in name:
        return "a NUL byte in it"
    if "\\" in name:
        return "a backslash in it (names use '/')"
    path = PurePosixPath(name)
    if path.is_absolute():
        return "an absolute path"
    if ".." in path.parts:
        return "'..' in it"
    if not path.parts:
        return "names the folder itself, not a file in it"
    return None


def inside(folder: Path, name: str, what: str, under: str = "") -> Path:
    """``folder / under / name``, or a HaloError when ``name`` would leave ``folder``.

    ``what`` says where the name came from (``FILE: KEY``); the error line starts with it.
    ``under`` is a trusted subfolder of ours (a snapshot in a cache) the name is relative to.
    Symlinks already on disk are followed, so a link inside ``folder`` pointing out of it is
    caught; the last component may be a link into ``folder`` (the HF cache's snapshots are).
    """
    why = name_problem(name)
    if why is not None:
        raise HaloError(f"{what}: {name!r}: {why}; refused (a name must stay inside {folder})")
    path = folder / under / name if under else folder / name
    base = folder.resolve()
    real = path.resolve()
    if real != base and base not in real.parents:
        raise HaloError(
            f"{what}: {name!r} resolves through a symlink to {real}, outside {folder}; refused"
        )
    return path
