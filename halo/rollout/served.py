"""The model a CPU server serves in tests: what the bundled trainer makes and exports.

The SFT example (a tiny Llama with head_dim 64, as vLLM's CPU attention needs, and the
examples' tokenizer and chat template) is trained and exported as a Hugging Face folder with
`halo export`'s code. Nothing is downloaded. It runs in a python that has the trainer's
dependencies (torch, transformers): the server's stack has them::

    python -m halo.rollout.served OUT [--epochs N]

Two departures from the example, both for online GRPO's sake: 16 epochs instead of 4, so the
model answers in the example's format and gets some sums right (GRPO needs groups whose rewards
differ), and untied input and output embeddings: vLLM's CPU build packs the LM head for oneDNN
when it loads a model, and an in-place reload does not repack a head tied to the embeddings,
so a tied model would keep serving its first head after every push (the push's check catches
it: the served log-probs differ from the policy's).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from halo.errors import HaloError
from halo.paths import find_repo

CONFIG = "examples/sft/config.yaml"
JOB = "tiny-sft"


def build(out: Path, epochs: int) -> Path:
    from halo.train import checkpoint, export

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
        f"--training.epochs={epochs}",
        "--model.config.tie_word_embeddings=false",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
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
    p.add_argument("--epochs", type=int, default=16)
    args = p.parse_args(argv)
    try:
        print(build(args.out.resolve(), args.epochs))
    except HaloError as exc:
        print(f"halo: error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
