"""`halo fetch SET…` and `halo store verify|gc`: fill the content-addressed store and keep it honest."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fetch",
        help="download a pin set's artifacts into the content-addressed store (and repair corrupt ones)",
    )
    p.add_argument(
        "sets",
        nargs="+",
        metavar="SET",
        help="pin set(s) to fetch (e.g. cpu), or base(s) whose OS lock's .debs to fetch (e.g. debian12-python)",
    )
    p.set_defaults(func=_fetch)

    store = sub.add_parser("store", help="verify, repair and clean the content-addressed store")
    ssub = store.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    v = ssub.add_parser("verify", help="hash every entry again; exit 1 if one is corrupt")
    v.add_argument(
        "--repair",
        action="store_true",
        help="fetch corrupt entries a lock names again; remove those nothing names",
    )
    v.set_defaults(func=_verify)
    g = ssub.add_parser(
        "gc", help="drop dead partial downloads and entries no lock or derivation names"
    )
    g.add_argument("--dry-run", action="store_true", help="list what would go; remove nothing")
    g.set_defaults(func=_gc)


def _deb_locks(names: list[str] | None = None):  # type: ignore[no-untyped-def]
    """The committed OS locks (pins/debian.BASE.lock.toml): all, or those of the named bases."""
    from halo.paths import Layout, find_repo
    from halo.pins.deblock import deb_lock_path, load_deb_lock

    pins = Layout(find_repo()).pins
    if names is None:
        return [load_deb_lock(p) for p in sorted(pins.glob("debian.*.lock.toml"))]
    return [load_deb_lock(deb_lock_path(pins, n)) for n in names]


def _locks(sets: list[str] | None = None):  # type: ignore[no-untyped-def]
    """The locks of the named sets (all sets, and every OS lock, by default), every input
    validated before any I/O; an OS lock enters as halo.store.debfetch sees it."""
    from halo.paths import Layout, find_repo
    from halo.pins.deblock import deb_lock_path
    from halo.pins.inputs import load_inputs
    from halo.pins.lockfile import load_lock
    from halo.store.debfetch import as_lock

    layout = Layout(find_repo())
    bases = [s for s in sets or [] if deb_lock_path(layout.pins, s).is_file()]
    named = [s for s in sets or [] if s not in bases]
    locks = []
    if named or not sets:  # an unknown set is named as such
        locks = [load_lock(layout.lock(s.name)) for s in load_inputs(layout.pins).select(named)]
    return locks + [as_lock(d) for d in _deb_locks(bases if sets else None)]


def _index(locks):  # type: ignore[no-untyped-def]
    """The package index(es), and the Debian mirror when an OS lock is among ``locks``."""
    from halo.sources import debian_mirror, index_urls
    from halo.store.debfetch import DebMirror, Indexes
    from halo.store.index import IndexClient

    debs = _deb_locks([lk.set for lk in locks if lk.platform.startswith("debian-")])
    members: list[object] = []
    if debs:
        members.append(DebMirror.for_locks(debian_mirror(debs[0].inputs.suite), debs))
    if any(not lk.platform.startswith("debian-") for lk in locks):
        members.append(IndexClient(index_urls()))
    return Indexes(members)


def _fetch(args: argparse.Namespace) -> int:
    from halo.paths import store_root
    from halo.sources import substitute_dirs
    from halo.store.fetch import fetch_lock, summary
    from halo.store.store import Store

    locks = _locks(args.sets)
    store = Store(store_root())
    index = _index(locks)
    for lock in locks:
        print(summary(lock.set, fetch_lock(lock, store, index, substitute_dirs())))
    return 0


def _verify(args: argparse.Namespace) -> int:
    import sys

    from halo.paths import store_root
    from halo.report import table
    from halo.sources import substitute_dirs
    from halo.store.maintenance import verify_store
    from halo.store.store import Store

    locks = _locks()
    store = Store(store_root())
    index = _index(locks) if args.repair else None
    report = verify_store(store, locks, index, substitute_dirs() if args.repair else ())
    rows = [
        ("entries hashed", report.checked),
        ("corrupt", len(report.corrupt)),
        ("repaired (fetched again)", len(report.repaired)),
        ("removed (no lock names them)", len(report.removed)),
        ("dead partial downloads", len(report.partials)),
    ]
    print(f"store {store.root}:")
    print(table(("", "count"), rows))
    for name in report.repaired:
        print(f"repaired: {name}")
    left = len(report.corrupt) - len(report.repaired) - len(report.removed)
    if left:
        print(
            f"halo: {left} corrupt store entr{'y' if left == 1 else 'ies'}; "
            "run `halo store verify --repair`",
            file=sys.stderr,
        )
        return 1
    return 0


def _gc(args: argparse.Namespace) -> int:
    from halo.paths import store_root
    from halo.report import human_bytes, table
    from halo.store.maintenance import gc_store
    from halo.store.store import Store

    store = Store(store_root())
    report = gc_store(store, _locks(), dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    print(
        table(
            ("", verb),
            [
                ("dead partial downloads", len(report.partials)),
                ("entries no lock or derivation names", len(report.entries)),
                ("stale stamps", len(report.stamps)),
                ("bytes", human_bytes(report.freed)),
            ],
        )
    )
    return 0
