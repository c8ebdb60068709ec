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
    where.add_argument("--native", action="store_true", help="run on this host's Python instead")
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
    return run_tier(
        t, image, scratch_root(), extra, serve=opts.serve, model=opts.model, place=place
    )


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
