"""`halo stack verify [SET...]`: install each GPU lock as its image does and prove it, no GPU.

Exit codes: 0 every check passed; 1 a check failed (one line per failure on stderr);
2 bad input (unknown set, no interpreter, artifacts missing from the store).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from halo.paths import Layout
    from halo.pins.lockfile import Lock
    from halo.stack.spec import StackSpec
    from halo.stack.verify import Inputs

from halo.paths import VENVS_ENV, venvs_root

NO_GPU = (
    "no GPU is used or claimed: these checks install, import, link and parse; "
    "no CUDA kernel runs (the gpu tiers stay skipped without a GPU)"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    from halo.stack.spec import DEFAULT_SETS

    parser = subparsers.add_parser("stack", help="prove the GPU stacks without a GPU")
    sub = parser.add_subparsers(dest="stack_command", metavar="ACTION", required=True)
    verify = sub.add_parser(
        "verify",
        help="install each set's lock offline as its image does, then check it",
        description=f"{NO_GPU}. Run `halo fetch SET` first: the wheels come from the store.",
    )
    verify.add_argument(
        "sets", nargs="*", metavar="SET", help=f"pin sets (default: {' '.join(DEFAULT_SETS)})"
    )
    verify.add_argument(
        "--venvs",
        type=Path,
        help=f"where the venvs live (default ${VENVS_ENV}, else <scratch>/stacks)",
    )
    verify.add_argument("--fresh", action="store_true", help="reinstall even an up-to-date venv")
    verify.add_argument(
        "--clean", action="store_true", help="remove each venv once its checks are done"
    )
    verify.add_argument(
        "--cpu-tier",
        action="append",
        default=[],
        metavar="SET",
        help="also run the CPU tier natively in this set's venv (repeatable)",
    )
    where = verify.add_mutually_exclusive_group()
    where.add_argument(
        "--image",
        metavar="NAME",
        help="check inside this built image (catalog name or ref), `docker run --network none`; "
        "nothing installed on the host",
    )
    where.add_argument(
        "--installed",
        type=Path,
        metavar="VENV",
        help=argparse.SUPPRESS,  # inside an image: check the venv its build installed
    )
    verify.add_argument(
        "--remove",
        action="store_true",
        help="with --image NAME: remove the image's tags once checked (CI's disk)",
    )
    verify.set_defaults(func=_verify)
    inst = sub.add_parser(
        "install",
        help="install a set's locked stack and halo as a venv (a host without Docker)",
        description="The images' own install step, offline from the store (run `halo fetch SET` "
        "first), with the set's CPython; then PREFIX/bin/halo launch ... trains natively.",
    )
    inst.add_argument("set", metavar="SET", help="pin set (e.g. cpu, blackwell)")
    inst.add_argument("prefix", metavar="PREFIX", type=Path, help="the venv to create")
    inst.add_argument("--fresh", action="store_true", help="reinstall even an up-to-date venv")
    inst.set_defaults(func=_install)


def _verify(args: argparse.Namespace) -> int:
    from halo.errors import HaloError
    from halo.paths import Layout, find_repo, scratch_root
    from halo.pins.lockfile import load_lock
    from halo.report import say, table
    from halo.stack.spec import DEFAULT_SETS, spec_for
    from halo.stack.verify import FAIL, verify

    layout = Layout(find_repo())
    names = list(args.sets or DEFAULT_SETS)
    if args.image or args.installed:
        if (
            len(names) != 1
            or args.cpu_tier
            or args.clean
            or args.fresh
            or (args.installed and args.remove)
        ):
            where = f"--image {args.image}" if args.image else "--installed"
            raise HaloError(
                f"{where}: checks exactly one SET, without --cpu-tier/--clean/--fresh "
                f"(got {' '.join(names) or 'none'}; the CPU tier: halo test cpu --image NAME)"
            )
        return _verify_image(args, layout, names[0])
    unknown = sorted(set(args.cpu_tier) - set(names))
    if unknown:
        raise HaloError(f"--cpu-tier {unknown[0]}: not among the sets checked ({' '.join(names)})")
    specs = [spec_for(n) for n in names]  # unknown sets fail before anything is installed
    locks = [load_lock(layout.lock(n)) for n in names]
    root = venvs_root(args.venvs)
    root.mkdir(parents=True, exist_ok=True)
    say(f"halo stack: {NO_GPU}")
    failures: list[str] = []
    for spec, lock in zip(specs, locks, strict=True):
        inputs = host_inputs(layout, spec, lock, root / spec.set)
        start = time.monotonic()
        say(f"halo stack: {spec.set}: CPython {inputs.python_version} ({inputs.python})")
        tier = scratch_root() / "stack-cpu-tier" / spec.set if spec.set in args.cpu_tier else None
        try:
            rows = verify(inputs, args.fresh, tier, lambda r: None)
        finally:
            if args.clean:
                for leftover in (inputs.venv, root / f".{spec.set}.probe"):
                    shutil.rmtree(leftover, ignore_errors=True)
        if args.clean and not any(r.result == FAIL for r in rows):
            (root / f"{spec.set}.install.log").unlink(missing_ok=True)  # kept when it failed
        print(f"\n{spec.set} ({time.monotonic() - start:.0f}s, no GPU)")
        print(table(["check", "result", "detail"], [[r.check, r.result, r.detail] for r in rows]))
        sys.stdout.flush()
        for row in rows:
            if row.result == FAIL:
                failures += [f"{spec.set}: {row.check}: {line}" for line in row.failures]
    for line in failures:
        print(f"halo: stack: {line}", file=sys.stderr)
    return 1 if failures else 0


def host_inputs(layout: Layout, spec: StackSpec, lock: Lock, venv: Path) -> Inputs:
    """What installing ``lock`` into ``venv`` on this host takes: the lock's CPython, the store."""
    from halo.paths import store_root
    from halo.stack.interpreter import find_python
    from halo.stack.verify import Inputs
    from halo.store.store import Store

    python, version = find_python(lock.python)
    return Inputs(
        spec=spec,
        lock=lock,
        store=Store(store_root()),
        python=python,
        python_version=version,
        venv=venv,
        patches=layout.patches,
        images=layout.images,
        repo=layout.repo,
    )


def _install(args: argparse.Namespace) -> int:
    from halo.paths import Layout, find_repo
    from halo.pins.lockfile import load_lock
    from halo.report import say
    from halo.stack.prefix import install_prefix
    from halo.stack.spec import spec_for

    layout = Layout(find_repo())
    spec = spec_for(args.set)
    prefix = args.prefix.resolve()
    prefix.parent.mkdir(parents=True, exist_ok=True)
    inputs = host_inputs(layout, spec, load_lock(layout.lock(args.set)), prefix)
    start = time.monotonic()
    for line in install_prefix(inputs, args.fresh):
        say(f"halo stack install: {args.set}: {line}")
    say(f"halo stack install: {prefix} ready in {time.monotonic() - start:.0f}s: {prefix}/bin/halo")
    return 0


def _attest(keys, target, set_name: str, rows: list) -> None:  # type: ignore[no-untyped-def,type-arg]
    """The image proved inside itself, as a test result of tier "stack" (what promote's gate
    asks of the server images): each check a test, passed, failed or skipped."""
    from halo.report import say
    from halo.stack.verify import FAIL, OK
    from halo.testing import attest_run
    from halo.testing.attest import (
        FAILED,
        PASSED,
        Outcome,
        RunInputs,
        checkout_tests_hash,
        ci_run_url,
    )

    passed = tuple(f"stack::{r.check}" for r in rows if r.result == OK)
    failed = tuple(f"stack::{r.check}" for r in rows if r.result == FAIL)
    skipped = tuple(f"stack::{r.check}" for r in rows if r.result not in (OK, FAIL))
    result = FAILED if failed or not passed else PASSED
    outcome = Outcome(result, passed, failed, skipped, attest_run.now_utc(), ci_run_url())
    inputs = RunInputs("stack", (), (set_name,), checkout_tests_hash(attest_run.repo_root()))
    attest_run.record(attest_run.local_store(), keys, target, inputs, outcome, say)


def _verify_image(args: argparse.Namespace, layout: Layout, set_name: str) -> int:
    """--image (on the host: run the check in the image) and --installed (inside it)."""
    from halo.pins.lockfile import load_lock
    from halo.report import say, table
    from halo.stack import in_image
    from halo.stack.spec import spec_for
    from halo.stack.verify import FAIL, Inputs
    from halo.store.store import Store

    spec = spec_for(set_name)
    start = time.monotonic()
    if args.image:
        from halo.testing import attest_run
        from halo.testing.attest import Keys
        from halo.testing.container import built_image_ref

        keys = Keys.from_env()  # a bad key is one line before the run, not after it
        ref = built_image_ref(args.image)
        target = attest_run.target_of(ref)  # asked before --remove takes the image away
        say(f"halo stack: {set_name} inside {ref} (docker run --network none): {NO_GPU}")
        try:
            rows, _ = in_image.run_in(ref, set_name)
        finally:
            if args.remove:
                for gone in in_image.remove_image(ref):
                    say(f"halo stack: removed {gone}")
        _attest(keys, target, set_name, rows)
        where = ref
    else:
        lock_path = layout.lock(set_name)
        record = in_image.build_record()
        venv = args.installed
        inputs = Inputs(
            spec=spec,
            lock=load_lock(lock_path),
            store=Store(Path("/nonexistent")),  # nothing is installed from a store in an image
            python=str(venv / "bin" / "python"),
            python_version=".".join(map(str, sys.version_info[:3])),
            venv=venv,
            patches=layout.patches,
            images=layout.images,
            repo=layout.repo,
        )
        rows = in_image.verify_installed(inputs, record, lock_path)
        in_image.emit(rows)
        return 1 if any(r.result == FAIL for r in rows) else 0
    print(f"\n{set_name} in {where} ({time.monotonic() - start:.0f}s, no GPU)")
    print(table(["check", "result", "detail"], [[r.check, r.result, r.detail] for r in rows]))
    sys.stdout.flush()
    failures = [
        f"{set_name}: {r.check}: {line}" for r in rows if r.result == FAIL for line in r.failures
    ]
    for line in failures:
        print(f"halo: stack: {line}", file=sys.stderr)
    return 1 if failures else 0
