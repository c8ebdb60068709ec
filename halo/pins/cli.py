"""`halo pins lock|check|diff|why`: resolve the pin sets, and check the rules that tie them.

`check`, `diff` and `why` are offline and read only pins/; `lock` is the one that resolves.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from halo.pins.deblocking import Load
    from halo.pins.invariants import ImagePython


def register(subparsers: argparse._SubParsersAction) -> None:
    pins = subparsers.add_parser("pins", help="lock the pin sets and check their invariants")
    sub = pins.add_subparsers(dest="pins_command", metavar="ACTION", required=True)

    lock = sub.add_parser("lock", help="resolve sets into pins/pylock.SET.toml (default: all)")
    lock.add_argument("sets", nargs="*", metavar="SET")
    lock.add_argument(
        "--check",
        action="store_true",
        help="re-resolve and compare; exit 1 with a diff where a lock drifted",
    )
    lock.add_argument(
        "--os",
        action="store_true",
        help="the bases' OS locks (pins/debian.BASE.lock.toml) instead: SETs name bases (default: all)",
    )
    lock.add_argument(
        "--platform",
        default="",
        metavar="OS/ARCH",
        help="with --os: the bases' OS locks for this platform (linux/arm64: "
        "pins/debian.BASE-arm64.lock.toml); default: every platform an image is built for",
    )
    lock.add_argument(
        "--upgrade",
        action="store_true",
        help="ignore the committed locks' pins (by default a re-lock keeps them where it can); "
        "with --os: resolve again even where a lock still answers its inputs",
    )
    lock.add_argument(
        "--upgrade-package",
        action="append",
        default=[],
        metavar="NAME",
        help="let NAME move to its newest allowed version (repeatable)",
    )
    lock.set_defaults(func=_lock)

    check = sub.add_parser("check", help="the cross-set invariants (offline)")
    check.set_defaults(func=_check)

    diff = sub.add_parser("diff", help="what differs between two locked sets")
    diff.add_argument("left", metavar="SET")
    diff.add_argument("right", metavar="SET")
    diff.set_defaults(func=_diff)

    why = sub.add_parser("why", help="which top-level requirement brings PKG into SET")
    why.add_argument("package", metavar="PKG")
    why.add_argument("set", metavar="SET")
    why.set_defaults(func=_why)

    src = sub.add_parser(
        "source-hash", help="content hash of a source tree or its archive (for pins/sources.toml)"
    )
    src.add_argument("path", metavar="PATH", type=Path)
    src.add_argument("--subdirectory", default="", help="hash only this folder of the tree")
    src.set_defaults(func=_source_hash)


def _pins_dir() -> Path:
    from halo.paths import Layout, find_repo

    return Layout(find_repo()).pins


def _lock(args: argparse.Namespace) -> int:
    from halo.pins.lockfile import lock_name
    from halo.pins.locking import check_locks, write_locks
    from halo.pins.resolve import Upgrade, UvResolver

    pins_dir = _pins_dir()
    if args.os:
        return _lock_os(args, pins_dir)
    upgrade = Upgrade(all=args.upgrade, packages=frozenset(args.upgrade_package))
    if args.check:
        drift = check_locks(pins_dir, args.sets, UvResolver(), upgrade)
        for diff in drift.values():
            sys.stdout.write(diff)
        if drift:
            names = " ".join(drift)
            print(
                f"halo: lock drift in: {names}; run `halo pins lock {names}`",
                file=sys.stderr,
            )
            return 1
        return 0
    for name, changed in write_locks(pins_dir, args.sets, UvResolver(), upgrade).items():
        print(f"pins/{lock_name(name)}: {'written' if changed else 'unchanged'}")
    return 0


def _os_inputs(names: list[str], platform: str = ""):  # type: ignore[no-untyped-def]
    """The DebInputs of the named mmdebstrap bases of images/images.yaml (all by default), for
    ``platform``, or for every platform an image on the base is built for (amd64 always). A
    name may carry its platform (debian12-python-arm64), as its OS lock's file does."""
    from halo.errors import HaloError
    from halo.images.catalog import load_catalog
    from halo.images.evaluate.bases import deb_inputs
    from halo.images.graph import AMD64, PLATFORMS, parse_platform
    from halo.paths import find_repo

    catalog = load_catalog(find_repo())
    bases = {n: b for n, b in catalog.bases.items() if b.recipe == "mmdebstrap"}
    wanted = [parse_platform(platform)] if platform else list(PLATFORMS)
    asked = []
    for n in names:
        twin = next((p for p in PLATFORMS if p.suffix and n.endswith(p.suffix)), None)
        if n not in bases and twin is not None and n.removesuffix(twin.suffix) in bases:
            asked.append((n.removesuffix(twin.suffix), twin))
        elif n in bases:
            asked += [(n, p) for p in wanted]
        else:
            raise HaloError(f"{catalog.path}: no base '{n}' (known: {', '.join(sorted(bases))})")
    if names:
        return [deb_inputs(bases[n], p) for n, p in asked]
    out = []
    for p in wanted:
        # A base has a twin for a platform when an image built for it stands on it.
        used = {
            b
            for i in catalog.images.values()
            if str(p) not in dict(i.unavailable)
            for b in filter(None, (i.base, i.builder))
        }
        out += [deb_inputs(bases[n], p) for n in sorted(bases) if p == AMD64 or n in used]
    return out


def _lock_os(args: argparse.Namespace, pins_dir: Path) -> int:
    import time

    from halo.pins.deblock import deb_lock_name
    from halo.pins.deblocking import drift, lock_bases

    wanted = _os_inputs(args.sets, args.platform)
    if args.check:
        drifted = {i.base: drift(pins_dir, i) for i in wanted}
        drifted = {b: lines for b, lines in drifted.items() if lines}
        for lines in drifted.values():
            print("\n".join(lines))
        if drifted:
            names = " ".join(drifted)
            print(
                f"halo: OS lock drift in: {names}; run `halo pins lock --os {names}`",
                file=sys.stderr,
            )
            return 1
        print(f"OS locks: {len(wanted)} bases answer their inputs")
        return 0

    from halo.pins.debresolve import resolve
    from halo.sources import debian_mirror

    def timed(inputs):  # type: ignore[no-untyped-def]
        start = time.monotonic()
        lock = resolve(inputs, debian_mirror(inputs.suite))
        print(
            f"resolved {inputs.base}: {len(lock.debs)} .debs, {lock.total_size / 1e6:.1f} MB "
            f"in {time.monotonic() - start:.0f} s"
        )
        return lock

    for base, state in lock_bases(pins_dir, wanted, timed, upgrade=args.upgrade).items():
        print(f"pins/{deb_lock_name(base)}: {state}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from halo.pins.deblock import load_deb_lock
    from halo.pins.invariants import check_all
    from halo.pins.locking import load_all

    load = functools.cache(load_deb_lock)  # the images' Pythons and the OS checks read the same
    state = load_all(_pins_dir())
    violations = check_all(state, images=_image_pythons(load))
    violations += _check_os(load)
    for line in violations:
        print(line)
    if violations:
        print(f"halo: {len(violations)} pin invariant violation(s)", file=sys.stderr)
        return 1
    print(
        f"pins: {len(state.locks)} sets, {len(state.sources)} source pins, "
        f"{len(_os_inputs([]))} OS locks: all invariants hold"
    )
    return 0


def _check_os(load: Load) -> list[str]:
    """The OS locks' invariants, and that each answers its base's inputs (offline)."""
    from halo.pins.deblocking import drift

    pins_dir = _pins_dir()
    return [line for inputs in _os_inputs([]) for line in drift(pins_dir, inputs, load)]


def _image_pythons(load: Load) -> list[ImagePython]:
    """Each catalog image's pin set with the CPython its base ships (the OS lock's python3.X),
    and the builder's set with its builder base's: wheels for another CPython would not
    install there. Bases not made here from an OS lock ship no Python known to the check."""
    from halo.images.catalog import load_catalog
    from halo.images.evaluate.derivations import BUILDER_SET
    from halo.images.graph import PLATFORMS, base_lock_name, set_for
    from halo.paths import find_repo
    from halo.pins.deblock import cpython_of, deb_lock_path
    from halo.pins.invariants import ImagePython

    catalog = load_catalog(find_repo())
    shipped: dict[str, str | None] = {}
    out = []
    for platform in PLATFORMS:
        for image in sorted(catalog.images.values(), key=lambda i: i.name):
            if str(platform) in dict(image.unavailable):
                continue
            pairs = [(image.pins, image.base)] + (
                [(BUILDER_SET, image.builder)] if image.builder else []
            )
            for pin_set, base_name in pairs:
                if catalog.bases[base_name].recipe != "mmdebstrap":
                    continue
                twin = base_lock_name(base_name, platform)
                if twin not in shipped:
                    path = deb_lock_path(_pins_dir(), twin)
                    shipped[twin] = cpython_of(load(path)) if path.is_file() else None
                if (ships := shipped[twin]) is not None:
                    name = image.name + platform.suffix
                    out.append(ImagePython(name, set_for(pin_set, platform), twin, ships))
    return out


def _diff(args: argparse.Namespace) -> int:
    from halo.pins.locking import load_locks
    from halo.pins.query import diff_locks, render_diff

    left, right = load_locks(_pins_dir(), [args.left, args.right])
    print(render_diff(left, right, diff_locks(left, right)))
    return 0


def _why(args: argparse.Namespace) -> int:
    from halo.errors import HaloError
    from halo.pins.lockfile import lock_name
    from halo.pins.locking import load_locks
    from halo.pins.query import why

    (lock,) = load_locks(_pins_dir(), [args.set])
    chains = why(lock, args.package)
    if not chains:
        raise HaloError(
            f"pins/{lock_name(lock.set)}: no package '{args.package}' in set '{lock.set}'"
        )
    for chain in chains:
        print(" <- ".join(chain))
    return 0


def _source_hash(args: argparse.Namespace) -> int:
    from halo.pins.source_hash import source_hash

    print(source_hash(args.path, args.subdirectory))
    return 0
