"""`halo workflow render [--check]` and `halo workflow host-setup FEATURE…`."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    wf = sub.add_parser("workflow", help="the GitHub workflow: render it from ci/matrix.yaml")
    wsub = wf.add_subparsers(dest="workflow_command", metavar="ACTION", required=True)
    p = wsub.add_parser(
        "render", help="write .github/ (workflow, actionlint config) from ci/matrix.yaml"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 with a diff when a committed file differs",
    )
    p.set_defaults(func=_render)
    p = wsub.add_parser(
        "host-setup", help="prepare a hosted CI runner: mmdebstrap, a local registry (uses sudo)"
    )
    p.add_argument("features", nargs="+", metavar="FEATURE", help="mmdebstrap, registry")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.set_defaults(func=_host_setup)


def _render(args: argparse.Namespace) -> int:
    import difflib
    import sys

    from halo.atomic import write_text
    from halo.paths import find_repo
    from halo.schema import read_text
    from halo.workflow.matrix import parse_matrix
    from halo.workflow.render import render
    from halo.workflow.sessions import dev_pin, nox_sessions

    repo = find_repo()
    path = repo / "ci" / "matrix.yaml"
    matrix = parse_matrix(read_text(path), path, nox_sessions(repo / "noxfile.py"))
    files = render(matrix, dev_pin(repo / "pyproject.toml", "nox"))
    stale = {}
    for rel, text in files.items():
        current = (repo / rel).read_text() if (repo / rel).is_file() else ""
        if current != text:
            stale[rel] = current
    if not stale:
        print(f"{', '.join(map(str, files))}: up to date with ci/matrix.yaml")
        return 0
    if args.check:
        for rel, current in stale.items():
            sys.stdout.writelines(
                difflib.unified_diff(
                    current.splitlines(keepends=True),
                    files[rel].splitlines(keepends=True),
                    f"{rel} (committed)",
                    f"{rel} (rendered from ci/matrix.yaml)",
                )
            )
        print(
            f"halo workflow render --check: {', '.join(map(str, stale))} differs from "
            "ci/matrix.yaml; run `nox -s ci-render` and commit the result",
            file=sys.stderr,
        )
        return 1
    for rel in stale:
        write_text(repo / rel, files[rel])
    print(f"{', '.join(map(str, stale))}: written from ci/matrix.yaml ({len(matrix.jobs)} jobs)")
    return 0


def _host_setup(args: argparse.Namespace) -> int:
    from halo.workflow.hostsetup import apply

    apply(args.features, dry_run=args.dry_run)
    return 0
