"""`halo ci render [--check]`: ci/matrix.yaml to the GitHub workflow, or a diff against it."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    ci = sub.add_parser("ci", help="render the CI workflow from ci/matrix.yaml")
    csub = ci.add_subparsers(dest="ci_command", metavar="ACTION", required=True)
    p = csub.add_parser("render", help="write .github/workflows/<workflow>.yml from ci/matrix.yaml")
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 with a diff when the committed workflow differs",
    )
    p.set_defaults(func=_render)


def _render(args: argparse.Namespace) -> int:
    import difflib
    import sys

    from halo.atomic import write_text
    from halo.ci.matrix import parse_matrix
    from halo.ci.render import render
    from halo.ci.sessions import dev_pin, halo_commands, nox_sessions
    from halo.errors import HaloError
    from halo.paths import find_repo
    from halo.schema import read_text

    repo = find_repo()
    path = repo / "ci" / "matrix.yaml"
    if not path.is_file():
        raise HaloError(f"{path}: CI matrix not found")
    matrix = parse_matrix(read_text(path), path, nox_sessions(repo / "noxfile.py"), halo_commands())
    text = render(matrix, dev_pin(repo / "pyproject.toml", "nox"))
    out = repo / matrix.output
    current = out.read_text() if out.is_file() else ""
    if current == text:
        print(f"{matrix.output}: up to date with ci/matrix.yaml")
        return 0
    if args.check:
        sys.stdout.writelines(
            difflib.unified_diff(
                current.splitlines(keepends=True),
                text.splitlines(keepends=True),
                f"{matrix.output} (committed)",
                f"{matrix.output} (rendered from ci/matrix.yaml)",
            )
        )
        print(
            f"halo ci render --check: {matrix.output} differs from ci/matrix.yaml; "
            "run `nox -s ci-render` and commit the result",
            file=sys.stderr,
        )
        return 1
    write_text(out, text)
    print(f"{matrix.output}: written from ci/matrix.yaml ({len(matrix.jobs)} jobs)")
    return 0
