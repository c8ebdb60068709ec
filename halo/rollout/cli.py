"""`halo serve start|stop|status`: the CPU rollout server as a process on this host."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="start, stop or show a CPU rollout server on this host")
    p.add_argument("action", choices=("start", "stop", "status"))
    p.add_argument("server", nargs="?", default="vllm", help="vllm (default) or sglang")
    p.add_argument(
        "--model",
        type=Path,
        help="model folder (default: the online GRPO example's starting point, trained and exported)",
    )
    p.add_argument("--port", type=int, default=0, help="default: the server's usual port")
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from halo.errors import HaloError
    from halo.paths import find_repo, scratch_root
    from halo.report import table
    from halo.rollout import native
    from halo.rollout.servers import SERVERS, server

    scratch = scratch_root()
    if args.action == "status":
        rows = []
        for kind in SERVERS.values():
            run = native.Running.load(scratch, kind.name)
            why = kind.not_running()
            rows.append(
                (
                    kind.name,
                    kind.shown,
                    "answers" if why is None else "down",
                    run.pid if run and run.alive() else "-",
                    run.log if run else "-",
                )
            )
        print(table(("server", "url", "health", "pid (halo serve)", "log"), rows))
        return 0
    kind = server(args.server)
    if args.action == "stop":
        run = native.Running.load(scratch, kind.name)
        if run is None or not run.alive():
            raise HaloError(f"{kind.name}: no server started by `halo serve` is running")
        native.stop(run)
        native.Running.path(scratch, kind.name).unlink(missing_ok=True)
        print(f"serve: stopped {kind.name} (pid {run.pid}); log {run.log}")
        return 0
    run = native.start(kind, find_repo(), scratch, model=args.model, port=args.port)
    print(
        table(
            ("server", "url", "pid", "model", "ready", "log"),
            [(kind.name, run.url, run.pid, run.model, f"{run.ready_s:.0f}s", run.log)],
        )
    )
    return 0
