"""`halo launch` and `halo preflight`: start a training method, or check a config first."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "launch",
        help="run a training method (sft, offline-grpo, ...) from a YAML config",
        description="Run METHOD with CONFIG. Flags after `--` override config keys, "
        "e.g. `-- --training.max_steps=3 --lr=1e-5`.",
    )
    p.add_argument("method", nargs="?", help="method name (see --list)")
    p.add_argument("config", nargs="?", type=Path, help="the run's YAML config")
    p.add_argument("--list", action="store_true", help="list the methods and exit")
    _launch_flags(p)
    p.add_argument("extra", nargs=argparse.REMAINDER, help="-- --key=value overrides")
    p.set_defaults(func=launch)

    q = sub.add_parser(
        "preflight", help="check a run config: paths, writability, model, devices, disk"
    )
    q.add_argument("config", type=Path)
    q.add_argument(
        "--method", default=None, help="validate method-specific sections for this method"
    )
    q.add_argument("--nproc", type=int, default=1)
    q.add_argument("extra", nargs=argparse.REMAINDER, help="-- --key=value overrides")
    q.set_defaults(func=preflight)

    from halo.train.checkpoints import export
    from halo.train.models import hfcache
    from halo.train.observe import plot

    export.register(sub)
    hfcache.register(sub)
    plot.register(sub)


def _launch_flags(p: argparse.ArgumentParser, late: bool = False) -> None:
    """`halo launch`'s flags; ``late``: for the flags written after CONFIG (no defaults, so
    only what was typed there replaces what was parsed before)."""
    d = {"default": argparse.SUPPRESS} if late else {}
    flag = {"action": "store_true", **d}
    p.add_argument(
        "--nproc-per-node",
        "--nproc",
        dest="nproc",
        type=int,
        help="processes per node (torchrun for more than one; default: one per GPU)",
        **({"default": None} if not late else d),
    )
    p.add_argument("--dry-run", help="print the command (or script); run nothing", **flag)
    for name, kind, what in (
        ("--nnodes", int, "nodes (torchrun c10d rendezvous for more than one)"),
        ("--node-rank", int, "this node's rank (default: c10d assigns ranks as nodes join)"),
        ("--rdzv-endpoint", str, "HOST:PORT of the c10d rendezvous (the first node)"),
        ("--rdzv-id", str, "the job's rendezvous id, the same on every node"),
        ("--partition", str, "--slurm: the partition"),
        ("--account", str, "--slurm: the account"),
        ("--time", str, "--slurm: the time limit (sbatch --time)"),
        ("--gpus-per-node", int, "--slurm: GPUs per node"),
        ("--container", str, "--slurm: a pyxis image (.sqsh or docker ref) or an Apptainer .sif"),
        ("--venv", str, "--slurm: a venv with halo and the stack (DIR/bin/halo)"),
        ("--grace", int, "--slurm: seconds before the time limit that SIGTERM comes"),
    ):
        p.add_argument(name, type=kind, help=what, **({"default": None} if not late else d))
    p.add_argument("--nodes", dest="nnodes", type=int, help="--slurm: nodes (= --nnodes)", **d)
    for key, what in PARALLEL_FLAGS.items():  # the seed's flags (runtime.parallelism)
        spelled = "--" + key.replace("_", "-")
        p.add_argument(
            f"--{key}", spelled, type=int, help=what, **({"default": None} if not late else d)
        )
    p.add_argument("--slurm", help="write an sbatch script and submit it", **flag)
    p.add_argument("--requeue", help="--slurm: requeue the job on node failure", **flag)


# The seed's parallelism flags: runtime.parallelism keys, forwarded to every node.
PARALLEL_FLAGS = {
    "expert_parallel_size": "experts split over this many ranks (borrowed from dp_shard)",
    "tensor_parallel_size": "attention and dense MLPs split over this many ranks",
    "context_parallel_size": "each sequence split over this many ranks (ring attention)",
}


def parallel_overrides(args: argparse.Namespace) -> list[str]:
    return [
        f"--runtime.parallelism.{key}={getattr(args, key)}"
        for key in PARALLEL_FLAGS
        if getattr(args, key, None) is not None
    ]


# Launch flags that are config keys: they reach the trainer (and every node) as overrides.
FLAG_KEYS = {
    "nnodes": "runtime.nnodes",
    "node_rank": "runtime.node_rank",
    "rdzv_endpoint": "runtime.rdzv.endpoint",
    "rdzv_id": "runtime.rdzv.id",
    "partition": "runtime.slurm.partition",
    "account": "runtime.slurm.account",
    "time": "runtime.slurm.time",
    "gpus_per_node": "runtime.slurm.gpus_per_node",
    "container": "runtime.slurm.container",
    "venv": "runtime.slurm.venv",
    "grace": "runtime.slurm.grace_s",
}


def flag_overrides(args: argparse.Namespace) -> list[str]:
    import json

    if getattr(args, "nnodes", None) is not None and args.nnodes < 1:
        from halo.errors import HaloError

        raise HaloError(f"--nnodes: expected a positive number, got {args.nnodes}")
    out = [
        f"--{key}={json.dumps(getattr(args, dest))}"
        for dest, key in FLAG_KEYS.items()
        if getattr(args, dest, None) is not None
    ]
    if getattr(args, "requeue", False):
        out.append("--runtime.slurm.requeue=true")
    return out + parallel_overrides(args)


def _extra(args: argparse.Namespace) -> list[str]:
    """The config overrides. Launch flags written after CONFIG land in `extra` too: take them.

    argparse drops the first `--` when nothing precedes it, so without one every token that
    is not a launch flag is an override; with one, only what follows it is.
    """
    rest = list(args.extra)
    late = argparse.ArgumentParser(prog=f"halo {args.command}", add_help=False)
    if hasattr(args, "dry_run"):
        _launch_flags(late, late=True)
    else:
        late.add_argument("--nproc", type=int, default=args.nproc)
    if "--" in rest:
        cut = rest.index("--")
        known, unknown = late.parse_known_args(rest[:cut])
        if unknown:
            from halo.errors import HaloError

            raise HaloError(f"unexpected arguments {unknown}; put config overrides after `--`")
        overrides = rest[cut + 1 :]
    else:
        known, overrides = late.parse_known_args(rest)
    for k, v in vars(known).items():
        setattr(args, k, v)
    return overrides


def _default_nproc(devices: object, gpus: int) -> int:
    if isinstance(devices, list):
        return len(devices)
    return max(gpus, 1)


def launch(args: argparse.Namespace) -> int:
    from halo.errors import HaloError
    from halo.report import table
    from halo.train import config
    from halo.train.launch import launcher
    from halo.train.launch import preflight as pf
    from halo.train.methods import registry
    from halo.train.parallel import support
    from halo.urls import HIDDEN, hide_argv, is_secret_name

    reg = registry.default()
    if args.list:
        specs = [reg.get(n) for n in reg.names()]
        print(
            table(
                [
                    "method",
                    "what it trains",
                    "data",
                    "reference model",
                    "rollout server",
                    "parallel dims",
                ],
                [
                    [s.name, s.summary, s.data, s.reference, s.server, support.shown(s.name)]
                    for s in specs
                ],
            )
        )
        return 0
    if not args.method or not args.config:
        raise HaloError("launch: expected METHOD CONFIG (or --list)")
    spec = reg.get(args.method)
    user = _extra(args)
    extra = flag_overrides(args) + user
    # model.config against its transformers class, and the mesh against the model, import
    # transformers and torch: ~3 s of CPU, 29 s under qemu. A launch of one process is this
    # process after exec, and the trainer checks both before anything starts (halo.train.run),
    # with the same one-line refusal; every other launch checks them here, before any process.
    cfg = config.load(args.config, spec.name, extra, model_class=False)
    if args.slurm:
        from halo.train.launch import slurm

        forwarded = parallel_overrides(args) + user
        job = slurm.job_from_config(spec.name, args.config.resolve(), cfg, args.nproc, forwarded)
        # The launch's own inputs (nodes, batch, container, venv, sbatch) first: a wrong one is
        # answered at once, not after the model's class has imported transformers and torch.
        sbatch = slurm.Sbatch()
        slurm.refuse(job, args.dry_run, sbatch)
        config.check_model_class(cfg, args.config)
        dims = _mesh(cfg, spec.name, job.nodes * job.nproc_per_node)
        rc = slurm.submit(job, args.dry_run, sbatch)
        if args.dry_run:
            print("\n".join(_plan(cfg, dims)))
        return rc
    gpus = pf.gpu_count()
    nproc = args.nproc if args.nproc is not None else cfg.runtime.nproc_per_node
    if nproc is None:
        nproc = _default_nproc(cfg.runtime.devices, gpus)
    plan = launcher.plan(
        spec,
        cfg,
        args.config.resolve(),
        nproc,
        extra,
        sys.executable,
        accelerate_installed=importlib.util.find_spec("accelerate") is not None,
    )
    checks = pf.gather(cfg, nproc, gpus)
    env = {**os.environ, **plan.env}
    if not args.dry_run:
        # The host's refusals need no torch: before the model's class imports it.
        pf.failures(checks)
        from halo.train.launch import fabric

        fabric.check(cfg.runtime.fabric, env)
    dims = None
    if args.dry_run or plan.launcher != "python":
        config.check_model_class(cfg, args.config)
        dims = _mesh(cfg, spec.name, nproc * cfg.runtime.nnodes)
    if args.dry_run:
        shown_env = " ".join(
            f"{k}={HIDDEN if is_secret_name(k) else shlex.quote(v)}"
            for k, v in sorted(plan.env.items())
        )
        where = f"{plan.nnodes} node(s) x " if plan.nnodes > 1 else ""
        print(
            f"# launcher: {plan.launcher}, {where}{plan.nproc} process(es), "
            f"gradient accumulation {plan.accumulation}"
        )
        shown = shlex.join(hide_argv(plan.argv))  # an override may carry a token
        print(f"command: {(shown_env + ' ') if shown_env else ''}{shown}")
        print(f"checkpoints: {cfg.job_dir}")
        print(f"logs: {cfg.log_dir / 'metrics.jsonl'}")
        print("# preflight")
        print(
            table(
                ["check", "ok", "detail"],
                [[c.name, "yes" if c.ok else "NO", c.detail] for c in checks],
            )
        )
        print("\n".join(_plan(cfg, dims)))
        print("# resolved config")
        print(config.dump_yaml(cfg), end="")
        print("# first example of each data source")
        for line in _describe(spec.view or spec.module, cfg):
            print(line)
        return 0
    print(f"halo launch: {shlex.join(hide_argv(plan.argv))}", file=sys.stderr, flush=True)
    if plan.launcher == "python":
        from halo.train.loop import stopping

        # Replace this process: a scheduler's SIGTERM then reaches the trainer itself. Until
        # the trainer's handler is in place the signals wait (the mask survives exec).
        stopping.block()
        os.execve(plan.argv[0], plan.argv, env)
    from halo.train.launch import supervise

    return supervise.run(plan.argv, env, cfg.job_dir)


def _mesh(cfg: Any, method: str, world: int) -> Any:
    """The run's mesh for ``world`` processes, checked against the model and the method
    before anything starts (torch-free: a login node checks it too)."""
    from halo.train.parallel import dims

    return dims.check(cfg, method, world)


def _plan(cfg: Any, mesh: Any) -> list[str]:
    from halo.train.parallel import plan

    return plan.describe(cfg, mesh)


def _describe(module: str, cfg: object) -> list[str]:
    """The method's view of each source's first example (rendered, loss mask in [[...]]).

    It needs the tokenizer libraries, not torch (the view modules import none): a login node
    that lacks one is told which in one line, and everything else of the dry run holds.
    """
    from halo.train.data import tokenizer

    missing = tokenizer.missing_library()
    if missing is None:
        try:
            tok = tokenizer.for_config(cfg)  # type: ignore[arg-type]
            return list(importlib.import_module(module).describe(cfg, tok))
        except ModuleNotFoundError as exc:
            missing = (exc.name or "").split(".")[0]
            if missing in ("", "halo"):
                raise  # a bug in halo itself: its traceback is what fixes it
    return [f"(not shown: the loss-mask view needs the Python package '{missing}' here)"]


def preflight(args: argparse.Namespace) -> int:
    from halo.report import table
    from halo.train import config
    from halo.train.launch import preflight as pf

    cfg = config.load(args.config, args.method, _extra(args))
    checks = pf.gather(cfg, args.nproc, pf.gpu_count())
    print(
        table(
            ["check", "ok", "detail"], [[c.name, "yes" if c.ok else "NO", c.detail] for c in checks]
        )
    )
    pf.failures(checks)
    print("preflight: ok")
    return 0
