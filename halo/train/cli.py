"""`halo launch` and `halo preflight`: start a training method, or check a config first."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys
from pathlib import Path


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
    p.add_argument("--nproc", type=int, default=None, help="processes (torchrun for more than one)")
    p.add_argument(
        "--dry-run", action="store_true", help="print the command, config and outputs; run nothing"
    )
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

    from halo.train import export, hfcache

    export.register(sub)
    hfcache.register(sub)


def _extra(args: argparse.Namespace) -> list[str]:
    """The config overrides. Launch flags written after CONFIG land in `extra` too: take them.

    argparse drops the first `--` when nothing precedes it, so without one every token that
    is not a launch flag is an override; with one, only what follows it is.
    """
    rest = list(args.extra)
    late = argparse.ArgumentParser(prog=f"halo {args.command}", add_help=False)
    late.add_argument("--nproc", type=int, default=args.nproc)
    if hasattr(args, "dry_run"):
        late.add_argument("--dry-run", action="store_true", default=args.dry_run)
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
    from halo.train import config, launcher, registry
    from halo.train import preflight as pf
    from halo.urls import redact_text

    reg = registry.default()
    if args.list:
        specs = [reg.get(n) for n in reg.names()]
        print(
            table(
                ["method", "module", "what it trains"],
                [[s.name, s.module, s.summary] for s in specs],
            )
        )
        return 0
    if not args.method or not args.config:
        raise HaloError("launch: expected METHOD CONFIG (or --list)")
    spec = reg.get(args.method)
    extra = _extra(args)
    cfg = config.load(args.config, spec.name, extra)
    gpus = pf.gpu_count()
    nproc = args.nproc if args.nproc is not None else _default_nproc(cfg.runtime.devices, gpus)
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
    if args.dry_run:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(plan.env.items()))
        print(f"# launcher: {plan.launcher}, {plan.nproc} process(es)")
        shown = redact_text(shlex.join(plan.argv))  # an override may carry a URL's token
        print(f"command: {(env + ' ') if env else ''}{shown}")
        print(f"checkpoints: {cfg.job_dir}")
        print(f"logs: {cfg.log_dir / 'metrics.jsonl'}")
        print("# preflight")
        print(
            table(
                ["check", "ok", "detail"],
                [[c.name, "yes" if c.ok else "NO", c.detail] for c in checks],
            )
        )
        print("# resolved config")
        print(config.dump_yaml(cfg), end="")
        print("# first example of each data source")
        for line in _describe(spec.module, cfg):
            print(line)
        return 0
    pf.failures(checks)
    print(f"halo launch: {shlex.join(plan.argv)}", file=sys.stderr, flush=True)
    env = {**os.environ, **plan.env}
    if plan.launcher == "python":
        from halo.train import stopping

        # Replace this process: a scheduler's SIGTERM then reaches the trainer itself. Until
        # the trainer's handler is in place the signals wait (the mask survives exec).
        stopping.block()
        os.execve(plan.argv[0], plan.argv, env)
    from halo.train import supervise

    return supervise.run(plan.argv, env, cfg.job_dir)


def _describe(module: str, cfg: object) -> list[str]:
    """The method's view of each source's first example (rendered, loss mask in [[...]])."""
    from halo.train import setup

    tok = setup.load_tokenizer(cfg)  # type: ignore[arg-type]
    return list(importlib.import_module(module).describe(cfg, tok))


def preflight(args: argparse.Namespace) -> int:
    from halo.report import table
    from halo.train import config
    from halo.train import preflight as pf

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
