"""The model a CPU server serves in tests: what the bundled trainer makes and exports.

The online GRPO example's starting point (examples/online-grpo/sft.yaml: the SFT example's
tiny Llama, head_dim 64 as vLLM's CPU attention needs, untied embeddings, the examples'
tokenizer and chat template, taught the training sums in several answer formats) is trained
and exported as a Hugging Face folder with `halo export`'s code. Nothing is downloaded. It
runs in a python that has the trainer's dependencies (torch, transformers): the server's
stack has them::

    python -m halo.rollout.served OUT
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from halo.errors import HaloError
from halo.paths import find_repo

CONFIG = "examples/online-grpo/sft.yaml"
JOB = "tiny-grpo-start"
NAME = JOB  # the folder `halo serve` trains it into, under its scratch


def build(out: Path) -> Path:
    from halo.train.checkpoints import checkpoint, export

    work = out.with_name(f".{out.name}.train")
    shutil.rmtree(work, ignore_errors=True)
    argv = [
        sys.executable,
        "-m",
        "halo.train.run",
        "--method",
        "sft",
        "--config",
        str(find_repo() / CONFIG),
        f"--runtime.paths.checkpoints={work}/checkpoints",
        f"--runtime.paths.logs={work}/logs",
        "--checkpoint.resume=false",
    ]
    # One thread: the model is too small for a second to help, and on a busy machine its
    # spinning threads made the run 3-4x slower (measured on 2 shared cores).
    env = {"OMP_NUM_THREADS": "1", **os.environ}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise HaloError(f"{CONFIG}: training the served model failed: {tail}")
    newest = checkpoint.latest(work / "checkpoints" / JOB)
    if newest is None:
        raise HaloError(f"{work}: the SFT run left no checkpoint")
    export.export(newest.path, out)
    shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m halo.rollout.served")
    p.add_argument("out", type=Path)
    args = p.parse_args(argv)
    try:
        print(build(args.out.resolve()))
    except HaloError as exc:
        print(f"halo: error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
