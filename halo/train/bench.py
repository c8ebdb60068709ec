"""Training throughput: `halo launch sft` against TRL's SFTTrainer, same model, data and batches.

    python -m halo.train.bench [--repeats N]          # the table, ratio, exit 1 below the floor
    python -m halo.train.bench --trl CONFIG OUT       # (internal) one TRL run, step times to OUT

Both train the ~30M-parameter Llama of examples/bench/config.yaml from the same seed on the
SFT example's chats (assistant tokens only), batch 8, one epoch (8 steps), on the CPU, each
in its own process. Throughput is tokens (non-padding, as each side counts them) over the
summed time of the optimizer steps, start-up excluded. The two alternate (ours, TRL, TRL,
ours, ...), so a busy neighbour on a shared machine slows both, and the medians are compared.
TRL is not a trainer dependency: the bench's own environment (`nox -s bench`) installs it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "bench" / "config.yaml"
GOAL, FLOOR = 1.3, 1.0


def _rate(steps: list[tuple[int, float]]) -> float:
    return sum(n for n, _ in steps) / sum(s for _, s in steps)


def ours(config: Path, tmp: Path) -> list[tuple[int, float]]:
    """`halo launch sft` as a user runs it; per-step (tokens, seconds) from metrics.jsonl."""
    argv = [sys.executable, "-m", "halo", "launch", "sft", str(config), "--"]
    argv += [f"--runtime.paths.checkpoints={tmp / 'ck'}", f"--runtime.paths.logs={tmp / 'logs'}"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench: halo launch failed: {proc.stderr.strip()[-800:]}")
    rows = [
        json.loads(x)
        for x in next((tmp / "logs").iterdir()).joinpath("metrics.jsonl").read_text().splitlines()
    ]
    return [(r["tokens"], r["seconds"]) for r in rows if "tokens" in r]


def trl(config: Path, tmp: Path) -> list[tuple[int, float]]:
    out = tmp / "trl.json"
    argv = [sys.executable, "-m", "halo.train.bench", "--trl", str(config), str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench: TRL run failed: {proc.stderr.strip()[-800:]}")
    return [tuple(x) for x in json.loads(out.read_text())]  # type: ignore[misc]


def run_trl(config: Path, out: Path) -> None:
    """One SFTTrainer run on the same model, data, batch and steps; step times to ``out``."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from halo.train import config as config_mod
    from halo.train import data, formats, setup
    from halo.train import model as hf

    cfg = config_mod.load(config, "sft")
    tok = setup.load_tokenizer(cfg)
    model = hf.build(cfg.model, hf.hf_config(cfg.model, tok), "sdpa", cfg.training.seed)
    chats = data.load(
        cfg.data, cfg.training.seed, lambda r, f, s, w: formats.chat(r, f, w, {}, {})
    )[0]
    dataset = Dataset.from_list([{"messages": c.messages} for c in chats])
    steps: list[list[float]] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            steps.append([0, time.monotonic()])

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            steps[-1][1] = time.monotonic() - steps[-1][1]

    class Counting(SFTTrainer):
        def training_step(self, model: Any, inputs: Any, *a: Any, **kw: Any) -> Any:
            mask = inputs.get("attention_mask")
            steps[-1][0] += int(mask.sum()) if mask is not None else inputs["input_ids"].numel()
            return super().training_step(model, inputs, *a, **kw)

    t = cfg.training
    args = SFTConfig(
        output_dir=str(out.parent / "trl-out"),
        per_device_train_batch_size=t.global_batch_size,
        num_train_epochs=t.epochs,
        learning_rate=cfg.optim.lr,
        lr_scheduler_type="cosine",
        weight_decay=cfg.optim.weight_decay,
        max_grad_norm=cfg.optim.grad_clip,
        max_length=cfg.data.max_seq_len,
        assistant_only_loss=True,
        save_strategy="no",
        logging_steps=10_000,
        report_to="none",
        use_cpu=True,
        seed=t.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    torch.manual_seed(t.seed)
    trainer = Counting(
        model=model, args=args, train_dataset=dataset, processing_class=tok.hf, callbacks=[Timer()]
    )
    trainer.train()
    out.write_text(json.dumps([(int(n), s) for n, s in steps]))


def measure(config: Path = CONFIG, repeats: int = 2) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"halo": [], "trl": []}
    runners = {"halo": ours, "trl": trl}
    for i in range(repeats):
        order = ("halo", "trl") if i % 2 == 0 else ("trl", "halo")
        for name in order:
            with tempfile.TemporaryDirectory(prefix="halo-bench-") as tmp:
                steps = runners[name](config, Path(tmp))
            rates[name].append(_rate(steps))
            print(
                f"bench: run {i + 1} {name}: {rates[name][-1]:.0f} tokens/s over {len(steps)} steps",
                file=sys.stderr,
                flush=True,
            )
    halo, other = statistics.median(rates["halo"]), statistics.median(rates["trl"])
    return {
        "halo_tokens_per_s": halo,
        "trl_tokens_per_s": other,
        "ratio": halo / other,
        "runs": rates,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m halo.train.bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument(
        "--trl", nargs=2, type=Path, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    if args.trl:
        run_trl(*args.trl)
        return 0
    from halo.report import table

    r = measure(args.config, args.repeats)
    if args.json:
        print(json.dumps(r))
    else:
        print(
            table(
                ["trainer", "tokens/s (median)"],
                [
                    ["halo launch sft (packing)", f"{r['halo_tokens_per_s']:.0f}"],
                    ["TRL SFTTrainer", f"{r['trl_tokens_per_s']:.0f}"],
                ],
            )
        )
        print(f"ratio: {r['ratio']:.2f}x (goal >= {GOAL}x, floor >= {FLOOR}x)")
    return 0 if r["ratio"] >= FLOOR else 1


if __name__ == "__main__":
    raise SystemExit(main())
