"""The process the launcher starts (once, or once per rank under torchrun).

python -m halo.train.run --method sft --config CONFIG [--key=value ...]
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from halo.errors import HaloError
from halo.train.stopping import StopFlag


def main(argv: Sequence[str] | None = None) -> int:
    # First thing, before torch is imported: SIGTERM/SIGINT from here on mean "stop cleanly".
    stop = StopFlag()
    stop.install()
    parser = argparse.ArgumentParser(prog="python -m halo.train.run")
    parser.add_argument("--method", required=True)
    parser.add_argument("--config", required=True, type=Path)
    args, extra = parser.parse_known_args(argv)
    try:
        return run(args.method, args.config, extra, stop)
    except HaloError as exc:
        print(f"halo: error: {exc.message}", file=sys.stderr, flush=True)
        return exc.exit_code
    finally:
        stop.done()


def run(method_name: str, config_path: Path, extra: list[str], stop: StopFlag) -> int:
    from halo.train import checkpoint, config, distributed, loop, registry, setup

    spec = registry.default().get(method_name)
    cfg = config.load(config_path, spec.name, extra)
    ctx = distributed.init()
    try:
        tok = setup.load_tokenizer(cfg)
        module = importlib.import_module(spec.module)
        method = module.build(cfg, tok)
        hook = checkpoint.test_hook_sleep(os.environ.get(checkpoint.TEST_HOOK_SLEEP_ENV))
        # A method with its own loop (online-grpo: rollouts between steps) brings its train().
        train = getattr(module, "train", loop.train)
        result = train(cfg, method, tok, ctx, stop, checkpoint_hook_sleep=hook)
        if ctx.is_main:
            first = result.losses.get(min(result.losses, default=0))
            last = result.losses.get(result.steps)
            rate = result.tokens / max(result.seconds, 1e-9)
            print(
                f"done: {result.steps} steps, loss {first} -> {last}, {rate:.0f} tokens/s, "
                f"checkpoint {result.checkpoint}"
                + (f" (stopped by {stop.name})" if result.stopped_by_signal else ""),
                flush=True,
            )
        distributed.shutdown(clean=True)
    finally:
        distributed.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
