"""`halo fetch SET…`: download and verify a pin set's artifacts into the store."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fetch", help="download a pin set's artifacts into the content-addressed store"
    )
    p.add_argument("sets", nargs="+", metavar="SET", help="pin set(s) to fetch (e.g. cpu)")
    p.set_defaults(func=_fetch)


def _fetch(args: argparse.Namespace) -> int:
    from halo.paths import Layout, find_repo, store_root
    from halo.pins.inputs import load_inputs
    from halo.pins.lockfile import load_lock
    from halo.sources import index_urls, substitute_dirs
    from halo.store.fetch import fetch_lock, summary
    from halo.store.index import IndexClient
    from halo.store.store import Store

    layout = Layout(find_repo())
    load_inputs(layout.pins).select(args.sets)  # an unknown set is named as such
    locks = [load_lock(layout.lock(name)) for name in args.sets]  # all inputs valid before any I/O
    store = Store(store_root())
    index = IndexClient(index_urls())
    for lock in locks:
        print(summary(lock.set, fetch_lock(lock, store, index, substitute_dirs())))
    return 0
