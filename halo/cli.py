"""`halo` command line: one sub-command per area, each registered by its own module.

Handlers import their heavy dependencies lazily so that `halo image build` on an
up-to-date image, `halo pins check` and `--help` start fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from halo import __version__
from halo.errors import HaloError

# Each module exposes register(subparsers) and sets `func` on its parsers.
COMMAND_MODULES = (
    "halo.pins.cli",
    "halo.store.cli",
    "halo.images.cli",
    "halo.cache.cli",
    "halo.patching.cli",
    "halo.testing.cli",
    "halo.rollout.cli",
    "halo.stack.cli",
    "halo.workflow.cli",
    "halo.devtools.cli",
    "halo.train.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="halo",
        description="Halo: train with `halo launch`; lock, fetch, build, test and publish the images.",
    )
    parser.add_argument("--version", action="version", version=f"halo {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except HaloError as exc:
        print(f"halo: error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("halo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
