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
from halo.errors import HaloError, os_error

# Each module exposes register(subparsers) and sets `func` on its parsers. A run builds only
# the parser of the command it names (a no-op build is budgeted well under a second; some
# modules' parsers pull in pydantic or the trainer's config); any other argv, `--help` included,
# gets them all. A command missing here still works, through the full parser.
COMMANDS = {
    "pins": "halo.pins.cli",
    "fetch": "halo.store.cli",
    "store": "halo.store.cli",
    "image": "halo.images.cli",
    "cache": "halo.cache.cli",
    "patches": "halo.patching.cli",
    "test": "halo.testing.cli",
    "example": "halo.testing.cli",
    "attest": "halo.testing.cli",
    "serve": "halo.rollout.cli",
    "stack": "halo.stack.cli",
    "workflow": "halo.workflow.cli",
    "run": "halo.devtools.cli",
    "docs": "halo.devtools.cli",
    "clean": "halo.devtools.cli",
    "paths": "halo.devtools.cli",
    "diagrams": "halo.devtools.cli",
    "launch": "halo.train.cli",
    "preflight": "halo.train.cli",
    "export": "halo.train.cli",
    "hf-cache": "halo.train.cli",
    "plot": "halo.train.cli",
    "job": "halo.jobs.cli",
}
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser; with ``command``, only that command's module is loaded (see COMMANDS)."""
    modules = (COMMANDS[command],) if command in COMMANDS else COMMAND_MODULES
    parser = argparse.ArgumentParser(
        prog="halo",
        description="Halo: train with `halo launch`; lock, fetch, build, test and publish the images.",
    )
    parser.add_argument("--version", action="version", version=f"halo {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise
            continue
        module.register(sub)
    return parser


def one_line(message: str) -> str:
    """An error as the one line the CLI promises, whatever shape its message came in (a list
    of problems, a tool's multi-line stderr)."""
    out = ""
    for line in (x.strip() for x in message.splitlines()):
        if line:
            out += line if not out else (" " if out.endswith(":") else "; ") + line
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except HaloError as exc:
        print(f"halo: error: {one_line(exc.message)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("halo: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0  # the reader went away (`halo ... | head`): nothing left to say
    except OSError as exc:
        # The environment, not the code: a full disk, a read-only mount, a file where a folder
        # should be, a file that cannot be read. Modules name their paths where they can; this
        # is the net for the ones that do not, so none of these reaches a user as a traceback.
        error = os_error(exc)
        print(f"halo: error: {one_line(error.message)}", file=sys.stderr)
        return error.exit_code
    except ModuleNotFoundError as exc:
        if not exc.name or exc.name.split(".")[0] == "halo":
            raise  # a bug in halo itself: its traceback is what fixes it
        # The trainer's stack (torch, transformers) is optional on a toolchain host.
        print(
            f"halo: error: `halo {args.command}` needs the Python package '{exc.name}', which "
            f"{sys.executable} does not have; run it inside the image (halo:cpu) or install "
            "halo-posttrain[train]",
            file=sys.stderr,
        )
        return HaloError.exit_code
    except UnicodeDecodeError as exc:
        # The same net for a text file read without halo.schema.read_text (which names it).
        print(
            f"halo: error: an input file is not UTF-8 text ({exc.reason} at byte {exc.start})",
            file=sys.stderr,
        )
        return HaloError.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
