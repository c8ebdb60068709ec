"""Lock and check the OS locks: glue between the bases' inputs, mmdebstrap and the lock files.

Stable by design. A committed lock is kept while its inputs (suite, variant, architecture,
component, packages) equal the catalog's and its invariants hold: the archive moving on (a
point release superseding a .deb) is not drift, since the locked .debs stay in the store and
the base stays the same bytes. Drift is a lock that no longer answers its inputs: inputs
changed in the catalog, an invariant broken, or no lock at all. `--upgrade` resolves again on
purpose and takes whatever the archive serves today.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from halo.atomic import write_text
from halo.pins.deblock import (
    DebInputs,
    DebLock,
    check_deb_lock,
    deb_lock_path,
    load_deb_lock,
    parse_deb_lock,
    render_deb_lock,
)

Resolve = Callable[[DebInputs], DebLock]
Load = Callable[[Path], DebLock]


def drift(pins_dir: Path, inputs: DebInputs, load: Load = load_deb_lock) -> list[str]:
    """Why the committed lock of ``inputs.base`` no longer answers its inputs ([] if it does).

    ``load`` reads a lock file: `halo pins check` passes one that remembers, since it reads
    the same OS locks for the images' Pythons (each lock parsed once: the check has a 1 s budget).
    """
    path = deb_lock_path(pins_dir, inputs.base)
    if not path.is_file():
        return [f"{path}: no OS lock; run `halo pins lock --os {inputs.base}`"]
    return check_deb_lock(load(path), f"pins/{path.name}", inputs)


def lock_bases(
    pins_dir: Path, wanted: Sequence[DebInputs], resolve: Resolve, upgrade: bool = False
) -> dict[str, str]:
    """{base: written | unchanged | kept}; resolves every base first, then writes (all or none)."""
    texts: dict[str, str] = {}
    states: dict[str, str] = {}
    for inputs in wanted:
        if not upgrade and not drift(pins_dir, inputs):
            states[inputs.base] = "kept (inputs unchanged; --upgrade resolves again)"
            continue
        lock = resolve(inputs)
        problems = check_deb_lock(lock, f"{inputs.base} (as resolved)", inputs)
        if problems:  # never write a lock that breaks its own rules
            from halo.errors import HaloError

            raise HaloError(problems[0])
        text = render_deb_lock(lock)
        parse_deb_lock(text, f"{inputs.base} (as rendered)")
        texts[inputs.base] = text
    for base, text in texts.items():
        path = deb_lock_path(pins_dir, base)
        same = path.is_file() and path.read_text() == text
        if not same:
            write_text(path, text)
            path.chmod(0o644)
        states[base] = "unchanged" if same else "written"
    return states
