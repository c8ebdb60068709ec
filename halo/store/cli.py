"""`halo fetch SET…` and `halo store verify|gc`: fill the content-addressed store and keep it honest."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fetch",
        help="download a pin set's artifacts into the content-addressed store (and repair corrupt ones)",
    )
    p.add_argument("sets", nargs="+", metavar="SET", help="pin set(s) to fetch (e.g. cpu)")
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


def _locks(sets: list[str] | None = None):  # type: ignore[no-untyped-def]
    """The locks of the named sets (all sets by default), every input validated before any I/O."""
    from halo.paths import Layout, find_repo
    from halo.pins.inputs import load_inputs
    from halo.pins.lockfile import load_lock

    layout = Layout(find_repo())
    selected = load_inputs(layout.pins).select(sets or [])  # an unknown set is named as such
    return [load_lock(layout.lock(s.name)) for s in selected]


def _fetch(args: argparse.Namespace) -> int:
    from halo.paths import store_root
    from halo.sources import index_urls, substitute_dirs
    from halo.store.fetch import fetch_lock, summary
    from halo.store.index import IndexClient
    from halo.store.store import Store

    locks = _locks(args.sets)
    store = Store(store_root())
    index = IndexClient(index_urls())
    for lock in locks:
        print(summary(lock.set, fetch_lock(lock, store, index, substitute_dirs())))
    return 0


def _verify(args: argparse.Namespace) -> int:
    import sys

    from halo.paths import store_root
    from halo.report import table
    from halo.sources import index_urls, substitute_dirs
    from halo.store.index import IndexClient
    from halo.store.maintenance import verify_store
    from halo.store.store import Store

    locks = _locks()
    store = Store(store_root())
    index = IndexClient(index_urls()) if args.repair else None
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
