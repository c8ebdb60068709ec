"""The process the launcher starts (once, or once per rank under torchrun).

python -m halo.train.run --method sft --config CONFIG [--key=value ...]

From config to the first step, top to bottom: the stop flag (before torch), the method by
name (methods.registry), the config (config.load), the mesh checked (parallel.dims), the
process group (parallel.distributed), the job folder's lock (launch.preflight's output checks,
checkpoints.joblock), the tokenizer (data.tokenizer), the method's data and loss (its
``build``), then ``loop.loop.train``: setup, resume, steps, checkpoints. Closing: the group
is shut down and the lock released, whatever happened.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from halo.errors import HaloError, os_error
from halo.train.loop.stopping import StopFlag


def _fail(message: str, code: int) -> int:
    print(f"halo: error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    # First thing, before torch is imported: SIGTERM/SIGINT from here on mean "stop cleanly".
    stop = StopFlag()
    stop.install()
    parser = argparse.ArgumentParser(prog="python -m halo.train.run")
    parser.add_argument("--method", required=True)
    parser.add_argument("--config", required=True, type=Path)
    args, extra = parser.parse_known_args(argv)
    # The same net as `halo`'s: what the environment or the inputs break is one line, exit 2
    # (exit 1 for a failure during training, which the loop raises as a HaloError with code 1).
    # Loaders name their file or key where they can; this catches the ones that do not.
    try:
        return run(args.method, args.config, extra, stop)
    except HaloError as exc:
        return _fail(exc.message, exc.exit_code)
    except OSError as exc:
        return _fail(os_error(exc).message, HaloError.exit_code)
    except OverflowError as exc:
        return _fail(f"a number is out of range for what uses it ({exc})", HaloError.exit_code)
    except UnicodeDecodeError as exc:
        return _fail(f"an input file is not UTF-8 text ({exc.reason})", HaloError.exit_code)
    finally:
        stop.done()


def run(method_name: str, config_path: Path, extra: list[str], stop: StopFlag) -> int:
    from halo.train import config
    from halo.train.methods import registry
    from halo.train.parallel import dims, distributed

    spec = registry.default().get(method_name)
    cfg = config.load(config_path, spec.name, extra)
    # A mesh that cannot be (ep not dividing the experts, ...) is one line before any group.
    dims.check(cfg, spec.name, int(os.environ.get("WORLD_SIZE", "1")))
    ctx = distributed.init()
    try:
        with _job_lock(cfg, ctx):
            _train(cfg, spec.module, ctx, stop)
        distributed.shutdown(clean=True)
    finally:
        distributed.shutdown()
    return 0


def _train(cfg: Any, module_name: str, ctx: Any, stop: StopFlag) -> None:
    from halo.train.checkpoints import checkpoint
    from halo.train.data import tokenizer as tk
    from halo.train.loop import loop

    tok = tk.for_config(cfg)
    module = importlib.import_module(module_name)
    with _s3_data(cfg, ctx):
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


@contextlib.contextmanager
def _job_lock(cfg: Any, ctx: Any) -> Iterator[None]:
    """Rank 0 checks what the run writes, then holds the job folder's lock for the run; every
    rank learns whether it got it (one decision, so no rank trains on a refused folder)."""
    from halo.train.checkpoints import joblock
    from halo.train.launch import preflight as pf

    lock, problem = None, None
    if ctx.is_main:
        try:
            pf.failures(pf.outputs(cfg))
            lock = joblock.JobLock(cfg.job_dir, lambda m: print(m, flush=True))
            lock.acquire()
        except HaloError as exc:
            problem = exc.message
        except OSError as exc:
            problem = os_error(exc, cfg.job_dir).message
    problem = ctx.broadcast(problem)
    if problem:
        raise HaloError(problem)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


@contextlib.contextmanager
def _s3_data(cfg: Any, ctx: Any) -> Iterator[None]:
    """s3:// sources: the first process of each node brings the cache up to date (and says
    what it did); then every process reads the cached copies without asking S3 again, so all
    of them train on the same bytes."""
    from halo.train.data import s3data

    sources = cfg.data.sources("train") + cfg.data.sources("eval")
    urls = [str(s.path) for s in sources if s3data.is_s3(s.path)]
    if not urls:
        yield
        return
    problem = None
    if ctx.local_rank == 0:
        try:
            s3data.prefetch(urls)
        except HaloError as exc:
            problem = exc.message
    if ctx.any(problem is not None):
        raise HaloError(problem or "data: another node could not fetch its s3:// data")
    before = os.environ.get(s3data.OFFLINE_ENV)
    os.environ[s3data.OFFLINE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(s3data.OFFLINE_ENV, None)
        else:
            os.environ[s3data.OFFLINE_ENV] = before


def _exit(code: int) -> None:
    """Exit; a rank of a finished multi-process run without the interpreter's teardown.

    Its group is destroyed and everything it wrote is closed, but torch's C++ threads of the
    run (gloo's, the store's) may still be joinable when static destructors run: a rank of a
    two-node Slurm run aborted there ("terminate called without an active exception",
    SIGABRT) after training and saving were done, failing the job. Nothing is left to run.
    """
    if code == 0 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import logging

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    raise SystemExit(code)


if __name__ == "__main__":
    _exit(main())
