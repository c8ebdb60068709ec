"""Training throughput of our loop next to a plain PyTorch loop on the same model and data.

    python -m halo.train.bench examples/sft/config.yaml

Both run one process, the same steps, batches, model init and optimizer; tokens/s counts
non-padding input tokens. Throughput is the median over steps of tokens/seconds, and the loops
run alternately a few times (best median counts), so a busy neighbour on a shared CI machine
skews neither side.
"""

from __future__ import annotations

import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from halo.train import config as config_mod
from halo.train import distributed, loop
from halo.train.data import Schedule
from halo.train.methods import sft
from halo.train.model import token_logprobs


def plain_loop(cfg: config_mod.Config, method: loop.Method, tok: Any) -> list[tuple[int, float]]:
    """What someone would write by hand: no process group, no checkpoints, no logging."""
    t = cfg.training
    model, _ = loop.build_model(cfg, tok)
    optim = loop.make_optimizer(cfg, model)
    sched = Schedule(len(method.items), t.global_batch_size, t.seed, t.epochs, t.max_steps)
    times = []
    for step in range(sched.total_steps):
        start = time.monotonic()
        b = method.collate([method.items[i] for i in sched.batch(step)])
        lp = token_logprobs(model(b["input_ids"]), b["targets"])
        loss = -(lp * b["weights"]).sum() / b["weights"].sum()
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        optim.step()
        times.append((int((b["targets"] != tok.pad_id).sum()), time.monotonic() - start))
    return times


def ours(cfg: config_mod.Config, method: loop.Method, tok: Any) -> list[tuple[int, float]]:
    ctx = distributed.Context(0, 1, 0, torch.device("cpu"))
    # The trainer's progress lines would bury the table.
    with (
        tempfile.TemporaryDirectory(prefix="halo-bench-") as tmp,
        contextlib.redirect_stdout(io.StringIO()),
    ):
        cfg.runtime.paths.checkpoints = Path(tmp) / "ck"
        cfg.runtime.paths.logs = Path(tmp) / "logs"
        result = loop.train(cfg, method, tok, ctx, save_final=False)
    return result.step_times


def rate(times: list[tuple[int, float]]) -> float:
    return statistics.median(n / s for n, s in times)


def measure(config_path: Path | str, repeats: int = 3) -> dict[str, float]:
    overrides = [
        "--checkpoint.every_steps=0",
        "--checkpoint.resume=false",
        "--logging.every_steps=1000000",
    ]
    cfg = config_mod.load(Path(config_path), "sft", overrides)
    tok = loop.load_tokenizer(cfg)
    method = sft.build(cfg, tok)
    best = {"ours": 0.0, "plain": 0.0}
    times: list[tuple[int, float]] = []
    for _ in range(repeats):
        for name, fn in (("plain", plain_loop), ("ours", ours)):
            times = fn(cfg, method, tok)
            best[name] = max(best[name], rate(times))
    return {
        "steps": len(times),
        "tokens_per_step": sum(n for n, _ in times) / max(len(times), 1),
        "ours_tokens_per_s": best["ours"],
        "plain_tokens_per_s": best["plain"],
        "ratio": best["ours"] / best["plain"],
    }


def main(argv: list[str] | None = None) -> int:
    from halo.report import table

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m halo.train.bench CONFIG", file=sys.stderr)
        return 2
    r = measure(args[0])
    print(
        table(
            ["loop", "tokens/s"],
            [
                ["halo (sft)", f"{r['ours_tokens_per_s']:.0f}"],
                ["plain pytorch", f"{r['plain_tokens_per_s']:.0f}"],
            ],
        )
    )
    print(f"ratio: {r['ratio']:.3f}x (must be >= 0.9)")
    return 0 if r["ratio"] >= 0.9 else 1


if __name__ == "__main__":
    raise SystemExit(main())
