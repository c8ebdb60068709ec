"""`halo patches list|apply|verify`.

``--json`` prints one object, stable for /etc/halo/build.json::

    {"mode": "apply" | "verify",
     "site": "<site-packages directory>",
     "patches": [{"name": str, "distribution": str, "version": str | null,
                  "state": "applied" | "already-applied" | "fixed-upstream"
                           | "not-installed" | "drift",
                  "files": [str, ...], "detail": str}, ...]}

In verify mode nothing is written and ``applied`` means "the defect is there and apply
would fix it". Exit codes: 0 ok; 1 drift (apply --strict, verify); 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VERIFY_IN_IMAGE = ["halo", "patches", "verify", "--json", "--patches", "/workspace/patches"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("patches", help="self-neutralizing patches to upstream packages")
    sub = parser.add_subparsers(dest="patches_command", metavar="ACTION", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--patches",
            type=Path,
            help="patch modules (default $HALO_PATCHES, else <repo>/patches)",
        )
        p.add_argument("--json", action="store_true", help="print the machine-readable report")

    lister = sub.add_parser("list", help="the patches and what they target")
    common(lister)
    lister.set_defaults(func=_list)

    apply = sub.add_parser("apply", help="apply the patches to a site directory")
    common(apply)
    apply.add_argument(
        "--site", type=Path, help="site-packages to patch (default: this interpreter's)"
    )
    apply.add_argument("--strict", action="store_true", help="drift exits 1 and nothing is written")
    apply.set_defaults(func=_apply)

    verify = sub.add_parser("verify", help="report each patch's state; change nothing")
    common(verify)
    target = verify.add_mutually_exclusive_group()
    target.add_argument(
        "--site", type=Path, help="site-packages to check (default: this interpreter's)"
    )
    target.add_argument("--image", help="check inside this image (a catalog NAME, or NAME:TAG)")
    verify.set_defaults(func=_verify)


def _load(args: argparse.Namespace):
    from halo.patching.loader import load_patches, patches_dir

    return load_patches(patches_dir(args.patches))


def _list(args: argparse.Namespace) -> int:
    from halo.report import table

    patches = _load(args)
    if args.json:
        rows = [
            {
                "name": p.name,
                "distribution": p.distribution,
                "versions": p.versions,
                "files": p.files,
                "summary": p.summary,
                "module": p.source,
            }
            for p in patches
        ]
        print(json.dumps({"patches": rows}, indent=2, sort_keys=True))
    else:
        print(
            table(
                ["patch", "distribution", "versions", "summary"],
                [[p.name, p.distribution, p.versions, p.summary] for p in patches],
            )
        )
    return 0


def _report(mode: str, site: Path, results, as_json: bool) -> None:
    from halo.report import table

    if as_json:
        doc = {"mode": mode, "site": str(site), "patches": [r.to_json() for r in results]}
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        rows = [
            [r.name, f"{r.distribution} {r.version or '-'}", r.state, r.detail] for r in results
        ]
        print(table(["patch", "installed", "state", "detail"], rows))


def _drift_exit(results) -> int:
    from halo.patching.engine import drift_lines

    lines = drift_lines(results)
    for line in lines:
        print(f"halo: drift: {line}", file=sys.stderr)
    return 1 if lines else 0


def _apply(args: argparse.Namespace) -> int:
    from halo.patching.engine import plan_all, write_plans
    from halo.patching.site import site_dir

    site = site_dir(args.site)
    plans = plan_all(_load(args), site)
    results = [p.result for p in plans]
    drifted = _drift_exit(results) if args.strict else 0
    if not drifted:
        write_plans(plans)
    _report("apply", site, results, args.json)
    return drifted


def _verify(args: argparse.Namespace) -> int:
    if args.image:
        return _verify_image(args)
    from halo.patching.engine import plan_all
    from halo.patching.site import site_dir

    site = site_dir(args.site)
    results = [p.result for p in plan_all(_load(args), site)]
    _report("verify", site, results, args.json)
    return _drift_exit(results)


def _verify_image(args: argparse.Namespace) -> int:
    from halo.testing.container import built_image_ref, run_in_image

    ref = built_image_ref(args.image)
    argv = VERIFY_IN_IMAGE if args.json else [a for a in VERIFY_IN_IMAGE if a != "--json"]
    return int(run_in_image(ref, argv))
