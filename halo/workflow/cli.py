"""`halo workflow render [--check]` and `halo workflow host-setup FEATURE…`."""

from __future__ import annotations

import argparse
from pathlib import Path


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
    p = wsub.add_parser(
        "run",
        help="run CI's sessions (ci/pipeline.toml) side by side as their order allows; "
        "print the table of minutes, tests, CPU and budgets",
    )
    p.add_argument("--pipeline", type=Path, help="the table (default: ci/pipeline.toml)")
    p.add_argument(
        "--report", type=Path, help="logs, junit and the table (default: <scratch>/ci-report)"
    )
    p.add_argument("--only", nargs="+", metavar="SESSION", help="run just these sessions")
    p.add_argument("--dry-run", action="store_true", help="print the schedule, run nothing")
    p.set_defaults(func=_run)


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


def _run(args: argparse.Namespace) -> int:
    from halo.paths import find_repo, scratch_root
    from halo.workflow.cirun import dry_run, run_ci
    from halo.workflow.machine import cores
    from halo.workflow.pipeline import check_plan, load_pipeline
    from halo.workflow.sessions import nox_sessions

    repo = find_repo()
    path = (args.pipeline or repo / "ci" / "pipeline.toml").resolve()
    shown = path.relative_to(repo) if path.is_relative_to(repo) else path
    pipeline = load_pipeline(path, nox_sessions(repo / "noxfile.py"), shown)
    if args.only:
        pipeline = pipeline.only(args.only)
    slots = check_plan(pipeline, cores() + 1.0)
    if args.dry_run:
        print(dry_run(pipeline, slots))
        return 0
    return run_ci(repo, pipeline, args.report or scratch_root() / "ci-report")
