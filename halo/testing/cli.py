"""`halo test TIER` and `halo example`: run inside an image through halo.testing.container."""

from __future__ import annotations

import argparse
import re
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("test", help="run a test tier inside an image (or --native)")
    p.add_argument("tier", help="cpu, gpu-core, gpu-full, rollout-vllm, rollout-sglang")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--image", help="catalog image to run in (default: cpu for cpu, else blackwell)"
    )
    where.add_argument(
        "--native",
        action="store_true",
        help="run on this host's Python instead (records no attestation: there is no image digest)",
    )
    p.add_argument(
        "--rerun",
        action="store_true",
        help="run even when a passing result for the same image, tests and arguments is recorded",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="rollout tiers: start the CPU server when none answers, stop it afterwards",
    )
    p.add_argument("--model", type=Path, help="with --serve: the model folder to serve")
    p.add_argument("--gpus", action="store_true", help="give the container the GPUs")
    p.add_argument(
        "--fabric", choices=("none", "efa"), default="none", help="NCCL's network (GPU runs)"
    )
    p.add_argument("--cuda-devices", default="all", help="GPU indices for the container (0,1)")
    p.add_argument("--server-tier", choices=("dense", "moe"), help="rollout server config")
    p.add_argument(
        "--read-only",
        action="store_true",
        help="docker run --read-only: only scratch and /tmp writable (as Enroot/Apptainer run it)",
    )
    p.add_argument("--user", help="docker run --user UID:GID (default: this host's user)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="after --: passed to pytest")
    p.set_defaults(func=_test)

    _register_attest(sub)

    p = sub.add_parser("example", help="the main job: train the tiny SFT example inside an image")
    p.add_argument("--image", default="cpu")
    p.add_argument("--method", default="sft")
    p.set_defaults(func=_example)


def _test(args: argparse.Namespace) -> int:
    from halo.paths import scratch_root
    from halo.testing.container import built_image_ref
    from halo.testing.tiers import Placement, run_tier, tier

    t = tier(args.tier)
    # REMAINDER takes options given after the tier too, and argparse may already have eaten the
    # `--`: our own options are picked out, everything else goes to pytest.
    rest = list(args.rest)
    cut = rest.index("--") if "--" in rest else len(rest)
    late = argparse.ArgumentParser(prog=f"halo test {args.tier}")
    late.add_argument("--image", default=args.image)
    late.add_argument("--native", action="store_true", default=args.native)
    late.add_argument("--serve", action="store_true", default=args.serve)
    late.add_argument("--model", type=Path, default=args.model)
    late.add_argument("--gpus", action="store_true", default=args.gpus)
    late.add_argument("--fabric", choices=("none", "efa"), default=args.fabric)
    late.add_argument("--cuda-devices", default=args.cuda_devices)
    late.add_argument("--server-tier", choices=("dense", "moe"), default=args.server_tier)
    late.add_argument("--read-only", action="store_true", default=args.read_only)
    late.add_argument("--user", default=args.user)
    late.add_argument("--rerun", action="store_true", default=args.rerun)
    opts, unknown = late.parse_known_args(rest[:cut])
    if opts.native and opts.image:
        late.error("--native and --image exclude each other")
    args.image, args.native = opts.image, opts.native
    if (opts.serve or opts.model) and not t.server:
        late.error("--serve and --model are for the rollout tiers")
    extra = [*unknown, *rest[cut + 1 :]]
    if (opts.read_only or opts.user) and args.native:
        late.error("--read-only and --user are docker run flags: not with --native")
    if opts.user and not re.fullmatch(r"\d+:\d+", opts.user):
        late.error(f"--user: expected UID:GID (numbers), got {opts.user!r}")
    image = (
        None
        if args.native
        else built_image_ref(args.image or ("cpu" if t.name == "cpu" else "blackwell"))
    )
    place = Placement(
        gpus=opts.gpus or opts.cuda_devices != "all" or opts.fabric != "none",
        fabric=opts.fabric,
        cuda_devices=opts.cuda_devices,
        server_tier=opts.server_tier or "",
        read_only=opts.read_only,
        user=opts.user,
    )
    if image is None:
        return run_tier(
            t, None, scratch_root(), extra, serve=opts.serve, model=opts.model, place=place
        )
    return _attested(t, image, extra, place, opts)


def _attested(t, image: str, extra: list[str], place, opts: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    """A tier in an image, as data: a passing result for the same inputs is reused (a tier
    that talks to a server never is: the server is an input nobody hashed); the result of a
    run is recorded, signed and attached (halo.testing.attest_run)."""
    from halo.errors import HaloError
    from halo.paths import scratch_root
    from halo.report import say
    from halo.testing import attest_run
    from halo.testing.attest import (
        Keys,
        RunInputs,
        checkout_tests_hash,
        ci_run_url,
        junit_names,
        outcome_of,
    )
    from halo.testing.tiers import junit_path, run_tier

    keys = Keys.from_env()
    target = attest_run.target_of(image)
    inputs = RunInputs(
        t.marker, tuple(extra), place.flags(), checkout_tests_hash(attest_run.repo_root())
    )
    store = attest_run.local_store()
    if not opts.rerun and not t.server:
        hit = attest_run.reuse(store, keys, target, inputs)
        if hit is not None:
            print(attest_run.cached_line(t.name, hit, target))
            return 0
    scratch = scratch_root()
    junit = junit_path(t, scratch)
    junit.unlink(missing_ok=True)  # an earlier run's report is not this run's result
    try:
        rc = run_tier(t, image, scratch, extra, serve=opts.serve, model=opts.model, place=place)
    except HaloError:
        names = junit_names(junit) if junit.is_file() else None
        if names is not None:  # it ran, then failed a check: recorded as failed
            outcome = outcome_of(1, names, attest_run.now_utc(), ci_run_url())
            attest_run.record(store, keys, target, inputs, outcome, say)
        raise
    names = junit_names(junit)
    if names is None:
        say(f"tier {t.name}: no junit report: nothing ran to attest")
        return rc
    outcome = outcome_of(rc, names, attest_run.now_utc(), ci_run_url())
    attest_run.record(store, keys, target, inputs, outcome, say)
    return rc


def _register_attest(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "attest",
        help="test results as signed in-toto attestations: keys, what is recorded, the gate",
        description="`halo test TIER --image REF` records a signed in-toto test-result "
        "attestation for the image (HALO_ATTEST_KEY: an ed25519 PEM private key); `halo image "
        "promote` accepts only those signed by a key in HALO_TRUSTED_KEYS (PEM public keys, "
        "separated by ':').",
    )
    asub = p.add_subparsers(dest="attest_command", metavar="ACTION", required=True)
    k = asub.add_parser("keygen", help="write a new ed25519 key: PATH (0600) and PATH.pub")
    k.add_argument("path", metavar="PATH", type=Path)
    k.set_defaults(func=_keygen)
    s = asub.add_parser(
        "show",
        help="the attestations recorded for an image (here and, for REPO@sha256:…, in its registry)",
    )
    s.add_argument("ref", metavar="REF", help="an image here, sha256:…, or REPO@sha256:…")
    s.add_argument("--json", action="store_true", help="print the envelopes, payload decoded")
    s.set_defaults(func=_show)
    v = asub.add_parser(
        "verify", help="would promote accept this digest? the catalog's gate, checked (no push)"
    )
    v.add_argument("name", metavar="NAME", help="catalog image")
    v.add_argument("ref", metavar="REF", help="the staged REPO@sha256:…")
    v.set_defaults(func=_verify)


def _keygen(args: argparse.Namespace) -> int:
    from halo.errors import HaloError
    from halo.paths import find_repo
    from halo.testing.attest import keygen

    path = args.path.absolute()
    try:
        repo = find_repo()
    except HaloError:
        repo = None
    if repo is not None and path.resolve().is_relative_to(repo):
        raise HaloError(f"{path}: inside the checkout {repo}; a private key never goes there")
    if not path.parent.is_dir():
        raise HaloError(f"{path.parent}: no such folder")
    keyid = keygen(path)
    print(f"{path}: ed25519 key {keyid[:12]} (public key: {path}.pub)")
    return 0


def _show(args: argparse.Namespace) -> int:
    from halo.report import table
    from halo.testing.attest import Keys, read, unique, verify
    from halo.testing.attest_store import envelope_json

    keys = Keys.from_env()
    envelopes, digests = _found(args.ref)
    atts = [read(e) for e in unique(envelopes)]
    if args.json:
        for att in atts:
            print(envelope_json(att.envelope))
        return 0
    rows = []
    for att in atts:
        st = att.statement
        keyid, why = verify(att, keys.trusted)
        signer = f"trusted {keyid[:12]}" if keyid else why
        if st is None:
            rows.append(("?", "?", "", "", signer, att.problem))
            continue
        args_ = " ".join(
            [
                *st.inputs.placement,
                *(["--", *st.inputs.pytest_args] if st.inputs.pytest_args else []),
            ]
        )
        counts = f"{len(st.outcome.passed)}/{len(st.outcome.failed)}/{len(st.outcome.skipped)}"
        rows.append(
            (
                st.inputs.tier,
                st.outcome.result,
                st.outcome.finished_on,
                counts,
                signer,
                f"tests {st.inputs.tests[:12]} {args_}".strip(),
            )
        )
    if not rows:
        print(
            f"{args.ref}: no attestations recorded ({', '.join(d[:19] for d in sorted(digests))})"
        )
        return 0
    print(
        table(("tier", "result", "finished", "passed/failed/skipped", "signature", "inputs"), rows)
    )
    return 0


def _found(ref: str) -> tuple[list[bytes], set[str]]:
    """The envelopes recorded for ``ref``: locally by its digests, and in its registry."""
    from halo.registry.refs import DIGEST
    from halo.testing import attest_run
    from halo.testing.attest_store import referrers

    store = attest_run.local_store()
    if DIGEST.match(ref):
        return store.for_digest(ref), {ref}
    envelopes: list[bytes] = []
    if "@sha256:" in ref:
        from halo.registry.client import Registry
        from halo.registry.refs import parse_ref

        src = parse_ref(ref)
        registry = Registry(src.repo.host)
        manifest = registry.get_manifest(src.repo, str(src.digest))
        digests = {str(src.digest)}
        if manifest is not None:
            digests.add(str(manifest.blobs()[0]["digest"]))
            envelopes += referrers(registry, src.repo, str(src.digest))
    else:
        digests = attest_run.target_of(ref).digests()
    for d in sorted(digests):
        envelopes += store.for_digest(d)
    return envelopes, digests


def _verify(args: argparse.Namespace) -> int:
    from halo.images.catalog import load_catalog
    from halo.images.publish import check_gate

    repo = _repo()
    image = load_catalog(repo).image(args.name)
    for line in check_gate(repo, image, args.ref):
        print(line)
    return 0


def _repo() -> Path:
    from halo.paths import find_repo

    return find_repo()


def _example(args: argparse.Namespace) -> int:
    """Train a shipped example in the image; outputs go to scratch, the checkout stays read-only."""
    from halo.testing.container import SCRATCH, RunSpec, built_image_ref, run_spec

    folder = {"sft": "sft", "offline-grpo": "grpo"}.get(args.method)
    if folder is None:
        from halo.errors import HaloError

        raise HaloError(
            f"halo example: no shipped example for method '{args.method}' (have: sft, offline-grpo)"
        )
    out = f"{SCRATCH}/example-{folder}"
    argv = [
        "halo",
        "launch",
        args.method,
        f"examples/{folder}/config.yaml",
        "--",
        f"--runtime.paths.checkpoints={out}/checkpoints",
        f"--runtime.paths.logs={out}/logs",
        "--checkpoint.resume=false",
    ]
    return run_spec(RunSpec(image=built_image_ref(args.image), argv=argv))
