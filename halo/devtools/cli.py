"""`halo run IMAGE -- CMD…`, `halo docs check`, `halo clean`, `halo diagrams`, `halo paths`."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="run a command inside an image with the shared docker flags (make train)"
    )
    p.add_argument("image", metavar="IMAGE", help="a catalog name (cpu, blackwell) or a reference")
    p.add_argument(
        "--gpus",
        choices=("auto", "yes", "no"),
        default="auto",
        help="GPU flags: auto = when the catalog builds IMAGE for CUDA architectures",
    )
    p.add_argument("--network", default="host", help="docker network (default: host)")
    p.add_argument(
        "--env-file",
        metavar="PATH",
        help="passed as docker's --env-file when it exists ('' for none; default: the "
        "checkout's .env); only its path is shown, never its values",
    )
    p.add_argument(
        "--aws-dir",
        metavar="DIR",
        help="mounted read-only as the container's ~/.aws when it exists ('' for none; "
        "default: ~/.aws)",
    )
    p.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="print the docker command instead of running it (what `make -n train` shows)",
    )
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD", help="the command to run")
    p.set_defaults(func=_run)

    docs = sub.add_parser("docs", help="check the README's and docs/' links and anchors")
    dsub = docs.add_subparsers(dest="docs_command", metavar="ACTION", required=True)
    p = dsub.add_parser("check", help="every relative link resolves, every #anchor exists")
    p.set_defaults(func=_docs_check)

    p = sub.add_parser("clean", help="remove caches and test scratch (never checkpoints)")
    p.add_argument("--dry-run", action="store_true", help="list what would go")
    p.set_defaults(func=_clean)

    p = sub.add_parser(
        "diagrams",
        help="regenerate docs/diagrams/ (DOT and SVG) from the code: layering, images, tiers",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="compare with what is committed instead of writing (exit 1 names what is stale)",
    )
    p.set_defaults(func=_diagrams)

    paths = sub.add_parser("paths", help="where Halo keeps things on this host")
    psub = paths.add_subparsers(dest="paths_command", metavar="WHAT", required=True)
    p = psub.add_parser(
        "scratch",
        help="the scratch folder: $HALO_SCRATCH, else found on the largest local volume",
    )
    p.add_argument("--why", action="store_true", help="also print why this folder")
    p.set_defaults(func=_paths_scratch)


def _run(args: argparse.Namespace) -> int:
    from halo.errors import HaloError
    from halo.images.catalog import load_catalog
    from halo.paths import find_repo, scratch_root
    from halo.testing.container import (
        RunSpec,
        built_image_ref,
        command_line,
        is_gpu_image,
        prepare_scratch,
        run_spec,
    )

    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise HaloError("halo run: name the command to run after `--`")
    ref = args.image
    if ":" not in ref and "@" not in ref:
        ref = load_catalog(find_repo()).image(ref).moving_ref
    gpus = {"yes": True, "no": False}.get(args.gpus)
    spec = RunSpec(
        image=ref,
        argv=argv,
        gpus=is_gpu_image(ref) if gpus is None else gpus,
        network=args.network,
        workspace_writable=True,  # a job writes its outputs next to its config
        credentials=True,
        env_file=args.env_file,
        aws_dir=args.aws_dir,
        offline=False,
    )
    if args.print_only:
        prepare_scratch(scratch_root())  # make runs the printed command itself
        print(command_line(spec))
        return 0
    built_image_ref(ref)
    return run_spec(spec)


def _docs_check(args: argparse.Namespace) -> int:
    from halo.devtools.doclinks import check
    from halo.errors import HaloError
    from halo.paths import find_repo

    repo = find_repo()
    count, broken = check(repo)
    for b in broken:
        print(f"{b.file.relative_to(repo)}:{b.line}: {b.target}: {b.why}")
    if broken:
        raise HaloError(f"docs: {len(broken)} broken link(s) in {count} file(s)")
    print(f"docs: {count} files, every link and anchor resolves")
    return 0


def _clean(args: argparse.Namespace) -> int:
    from halo.devtools.clean import clean
    from halo.paths import find_repo, scratch_root

    repo, scratch = find_repo(), scratch_root()
    plans = clean(repo, scratch, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    gone = [path for p in plans for path in p.removed]
    kept = [path for p in plans for path in p.kept]
    for path in gone:
        print(f"{verb} {path}")
    for path in kept:
        print(f"{'would keep' if args.dry_run else 'kept'} {path} (a checkpoint)")
    print(
        f"clean: {len(gone)} paths {verb}, {len(kept)} checkpoint folders kept; "
        "checkpoints are never removed"
    )
    return 0


def _paths_scratch(args: argparse.Namespace) -> int:
    from halo.paths import scratch_choice

    choice = scratch_choice()  # a fallback's reason goes to stderr, as for every command
    print(choice.path)
    if args.why:
        print(f"why: {choice.why}")
    return 0


def _diagrams(args: argparse.Namespace) -> int:
    import sys

    from halo.devtools import diagrams
    from halo.paths import find_repo

    repo = find_repo()
    files = diagrams.generate(repo, diagrams.dot_exe())
    stale = diagrams.stale(repo, files)
    if args.check:
        if stale:
            print(
                f"halo diagrams --check: {', '.join(map(str, stale))} "
                f"{'is' if len(stale) == 1 else 'are'} stale; run `make diagrams` and commit",
                file=sys.stderr,
            )
            return 1
        print(f"{diagrams.FOLDER}: {len(files)} files up to date with the code")
        return 0
    diagrams.write(repo, files, stale)
    for rel in stale:
        print(f"{rel}: {'written' if rel in files else 'removed (nothing generates it)'}")
    print(f"{diagrams.FOLDER}: {len(files)} files, {len(stale)} changed")
    return 0
