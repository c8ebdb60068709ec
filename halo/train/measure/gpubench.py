"""GPU throughput: the trainer's SFT step against a plain PyTorch loop, ~1B Llama, bf16, one GPU.

    python -m halo.train.measure.gpubench [--seq-lens 2048 4096] [--steps 8] [--json OUT]

Both sides train the same model (built from LLAMA_1B, no download) with the same attention
kernel (halo.train.models.attention's choice for this GPU), batch and bf16 autocast; the trainer side
is `halo.train.loop.loop.step` (collate, loss over weights, clip, fused AdamW, LR schedule), the
plain side the textbook loop (forward, cross-entropy, backward, clip, step). Tokens per step
are fixed (TOKENS_PER_STEP), so a longer sequence means a smaller batch.

MFU = tokens/s x FLOPs per token / peak dense bf16 FLOP/s of the GPU, with torchtitan's
count: FLOPs per token = 6 N + 12 l h q t (N parameters without the input embedding, l layers,
h heads, q head_dim, t sequence length; attention counted without the causal half, as
torchtitan does, so the numbers compare with its published ones). Budget: the trainer keeps
>= FLOOR of the plain loop's tokens/s. Without a GPU: one line, a "skipped: no GPU" row, exit 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
FLOOR = 0.95
TOKENS_PER_STEP = 16384
SEQ_LENS = (2048, 4096)

# ~1.1B parameters, Llama-3 shaped (GQA 32/8, head_dim 64, SwiGLU 4x).
LLAMA_1B: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "intermediate_size": 8192,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}

# Peak dense bf16 tensor FLOP/s by GPU name (vendor data sheets, without sparsity).
PEAK_BF16 = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),
    ("H200", 989e12),
    ("H800", 989e12),
    ("GB200", 2500e12),
    ("B200", 2250e12),
    ("A100", 312e12),
)

# The published point of comparison (pytorch/torchtitan, benchmarks/llama3_h100_202412_torchtitan.md):
ANCHOR = (
    "anchor: torchtitan reports 33-39% MFU for Llama 3.1 8B, bf16 (no Float8), FSDP on 8 and "
    "128 H100s (500 W HBM2e parts, MFU against the SXM peak; 5,762 tokens/s/GPU without "
    "torch.compile) - pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
)
FORMULA = (
    "MFU = tokens/s x (6 N + 12 l h q t) / peak dense bf16 FLOP/s "
    "(N without the input embedding; H100/H200 989 TFLOP/s)"
)


@dataclass(frozen=True)
class Side:
    tokens_per_s: float
    mfu: float | None
    step_s: float


@dataclass(frozen=True)
class Point:
    seq_len: int
    batch: int
    trainer: Side
    plain: Side

    @property
    def ratio(self) -> float:
        return self.trainer.tokens_per_s / self.plain.tokens_per_s


def peak_flops(name: str) -> float | None:
    for key, peak in PEAK_BF16:
        if key in name:
            return peak
    return None


def flops_per_token(conf: dict[str, Any], params: int, seq_len: int) -> float:
    embedding = conf["vocab_size"] * conf["hidden_size"]
    attention = 12 * conf["num_hidden_layers"] * conf["num_attention_heads"] * conf["head_dim"]
    return 6 * (params - embedding) + attention * seq_len


def no_gpu_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False"
    return None


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _timed(fn: Any, steps: int, warmup: int, device: str) -> float:
    """Median seconds per call of ``fn`` after ``warmup`` calls, the GPU synchronised."""
    import statistics

    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _items(seq_len: int, batch: int, vocab: int, seed: int) -> list[Any]:
    import torch

    from halo.train.data.examples import Sequence

    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(3, vocab, (batch, seq_len + 1), generator=g).tolist()
    return [Sequence(r[:-1], r[1:], [1.0] * seq_len) for r in rows]


def _trainer(
    conf: dict[str, Any],
    max_seq: int,
    batch: int,
    device: str,
    extra: tuple[str, ...] = (),
    ctx: Any = None,
    stray: dict[str, Any] | None = None,
) -> Any:
    """The trainer as `halo launch sft` builds it: config, tokenizer, setup (one GPU, or the
    process group of ``ctx``). ``stray``: model config fields transformers keeps as extra
    attributes, as it does loading a Hub config.json (Qwen3-MoE's head_dim)."""
    import torch

    from halo.train import config
    from halo.train.data import tokenizer as tk
    from halo.train.loop import setup
    from halo.train.methods import sft
    from halo.train.parallel import distributed

    overrides = [
        f"--model.config={json.dumps(conf)}",
        "--training.precision=bf16",
        f"--training.global_batch_size={batch}",
        f"--data.max_seq_len={max_seq}",
        # Rows of one length: padding-free packing would only add a block-diagonal mask.
        "--data.packing=false",
        *extra,
    ]
    cfg = config.load(REPO / "examples" / "bench" / "config.yaml", "sft", overrides)
    if stray and cfg.model.config is not None:
        cfg.model.config.update(stray)
    ctx = ctx or distributed.Context(0, 1, 0, torch.device(device))
    tok = tk.for_config(cfg)
    method = sft.build(cfg, tok)
    return setup.setup(cfg, method, tok, ctx, total_steps=10_000)


def _plain(conf_fields: dict[str, Any], backend: str, seed: int, device: str) -> tuple[Any, Any]:
    """The same model and optimizer settings, nothing of the trainer's."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from halo.train.models.hf import ATTN_IMPLEMENTATION

    fields = dict(conf_fields)
    conf = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            conf, attn_implementation=ATTN_IMPLEMENTATION[backend], dtype=torch.float32
        )
    optim = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0, fused=True)
    return model.train(), optim


def measure(
    seq_lens: tuple[int, ...] = SEQ_LENS,
    steps: int = 8,
    warmup: int = 3,
    conf: dict[str, Any] | None = None,
    tokens_per_step: int = TOKENS_PER_STEP,
    device: str = "cuda",
) -> dict[str, Any]:
    """Both sides at each sequence length. ``conf``/``device``/``tokens_per_step`` exist so
    that the CPU tier runs this same code on a tiny model (tests/cpu/test_gpubench.py)."""
    import torch
    from torch.nn import functional

    from halo.train.loop import loop
    from halo.train.models.hf import ATTN_IMPLEMENTATION

    conf = conf or LLAMA_1B
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    peak = peak_flops(name)
    tr = _trainer(conf, max(seq_lens), tokens_per_step // min(seq_lens), device)
    impl = tr.model.config._attn_implementation
    backend = next(k for k, v in ATTN_IMPLEMENTATION.items() if v == impl)
    params = sum(p.numel() for p in tr.model.parameters())
    trainer_s = {}
    for t in seq_lens:
        items = _items(t, tokens_per_step // t, conf["vocab_size"], seed=t)
        trainer_s[t] = _timed(lambda i=items, tr=tr: loop.step(tr, i), steps, warmup, device)
    del tr
    if device == "cuda":
        torch.cuda.empty_cache()
    model, optim = _plain(conf, backend, 0, device)
    points = []
    for t in seq_lens:
        batch = tokens_per_step // t
        ids = torch.randint(3, conf["vocab_size"], (batch, t + 1), device=device)
        x, y = ids[:, :-1], ids[:, 1:]

        def step(x: Any = x, y: Any = y) -> None:
            optim.zero_grad(set_to_none=True)
            with torch.autocast(device, dtype=torch.bfloat16):
                logits = model(input_ids=x, use_cache=False).logits
            loss = functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()

        plain_s = _timed(step, steps, warmup, device)
        fpt = flops_per_token(conf, params, t)

        def side(seconds: float, fpt: float = fpt) -> Side:
            rate = tokens_per_step / seconds
            return Side(rate, rate * fpt / peak if peak else None, seconds)

        points.append(Point(t, batch, side(trainer_s[t]), side(plain_s)))
    return {
        "gpu": name,
        "attention": backend,
        "params": params,
        "tokens_per_step": tokens_per_step,
        "peak_bf16_flops": peak,
        "points": [{**asdict(p), "ratio": p.ratio} for p in points],
        "ok": all(p.ratio >= FLOOR for p in points),
    }


# Qwen3-30B-A3B's published shape (seed 004's MoE), layers reduced to fit the GPUs there are.
QWEN3_30B_A3B: dict[str, Any] = {
    "model_type": "qwen3_moe",
    "vocab_size": 151936,
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "router_aux_loss_coef": 0.001,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}
# Its head_dim (128, not hidden / heads): an extra attribute to transformers' Qwen3MoeConfig.
QWEN3_30B_A3B_STRAY = {"head_dim": 128}
MOE_SEQ, MOE_BATCH = 2048, 4
MOE_ANCHOR = (
    "anchor: torchtitan reports 14,796 tokens/s per GPU for Qwen3-30B-A3B at EP=8 with DeepEP "
    "against 9,930 with all-to-all EP (+33%, 341 TFLOPS per GPU), H100s"
)


def moe_layers_that_fit(conf: dict[str, Any], free_bytes: float, ep: int = 1) -> int:
    """Decoder layers whose fp32 weights, gradients and AdamW moments (16 bytes a parameter,
    experts split ep ways) take at most half of ``free_bytes``; activations get the rest."""
    from halo.train.models.arch import from_config

    a = from_config({**conf, **QWEN3_30B_A3B_STRAY, "num_hidden_layers": 1})
    c = a.counts()
    per_layer = c["attention"] + c["router"] + c["experts"] / ep
    fixed = c["embeddings"]
    layers = int((0.5 * free_bytes / 16 - fixed) // per_layer)
    return max(1, min(layers, int(conf["num_hidden_layers"])))


def moe_flops_per_token(conf: dict[str, Any], seq_len: int) -> float:
    """6 x active parameters (top-k experts, the LM head; no embedding lookup) + attention."""
    from halo.train.models.arch import from_config

    a = from_config({**conf, **QWEN3_30B_A3B_STRAY})
    return 6 * a.active_params() + 12 * a.layers * a.heads * a.head_dim * seq_len


def measure_moe(
    conf: dict[str, Any] | None = None,
    seq_len: int = MOE_SEQ,
    batch: int = MOE_BATCH,
    steps: int = 6,
    warmup: int = 2,
    device: str = "cuda",
    ctx: Any = None,
    parallel: tuple[str, ...] = (),
    stray: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Tokens/s per GPU and MFU of the trainer's SFT step on the MoE (this process's share
    under torchrun: ``ctx`` and ``parallel``, e.g. ("--expert_parallel_size=8",))."""
    import torch

    from halo.train.loop import loop

    conf = dict(conf or QWEN3_30B_A3B)
    stray = QWEN3_30B_A3B_STRAY if stray is None else stray
    world = ctx.world if ctx is not None else 1
    # Each data-parallel rank gets ``batch`` rows (tp ranks share theirs).
    tp = next((int(x.split("=")[1]) for x in parallel if "tensor_parallel" in x), 1)
    dp = world // tp
    tr = _trainer(conf, seq_len, batch * dp, device, parallel, ctx, stray)
    items = _items(seq_len, batch * dp, conf["vocab_size"], seed=0)
    mine = tr.method.shard(items, *tr.ctx.data_shard())
    seconds = _timed(lambda: loop.step(tr, mine), steps, warmup, device)
    per_gpu = batch * seq_len * dp / world / seconds
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    peak = peak_flops(name)
    fpt = moe_flops_per_token({**conf, **stray}, seq_len)
    mesh = tr.ctx.mesh.dims if tr.ctx.mesh is not None else None
    backend = "one GPU: no exchange"
    if mesh is not None and mesh.ep > 1:
        backend = next(
            (b.dispatcher.name for b in tr.model.modules() if hasattr(b, "dispatcher")), "?"
        )
    return {
        "gpu": name,
        "gpus": world,
        "layers": conf["num_hidden_layers"],
        "ep": mesh.ep if mesh else 1,
        "tp": mesh.tp if mesh else 1,
        "backend": backend,
        "seq_len": seq_len,
        "batch": batch,
        "tokens_per_s_per_gpu": per_gpu,
        "mfu": per_gpu * fpt / peak if peak else None,
        "step_s": seconds,
    }


def moe_rows(results: list[dict[str, Any]], note: str = "") -> list[tuple[str, str, str, bool]]:
    """(benchmark, measured, budget, ok) rows of the MoE measurements (no floor: the anchor
    is torchtitan's, on other hardware; a row that ran is a pass, one that failed is not)."""
    out = []
    for r in results:
        if "failed" in r or "skipped" in r:
            what = f"gpu: MoE SFT step, Qwen3-30B-A3B-shaped, {r['run']}"
            text = f"skipped: {r['skipped']}" if "skipped" in r else f"failed: {r['failed']}"
            out.append((what, text, "measured (anchor: torchtitan)", "failed" not in r))
            continue
        how = (
            f"EP {r['ep']} ({r['backend']})"
            if r["ep"] > 1
            else f"TP {r['tp']}"
            if r["tp"] > 1
            else "one GPU"
        )
        name = (
            f"gpu: MoE SFT step, Qwen3-30B-A3B-shaped ({r['layers']} of 48 layers), bf16, "
            f"{how}, {r['gpus']} GPU(s), seq {r['seq_len']} x {r['batch']}"
        )
        measured = f"{r['tokens_per_s_per_gpu']:.0f} tok/s/GPU; MFU {_pct(r['mfu'])}" + note
        out.append((name, measured, "measured (anchor: torchtitan)", True))
    return out


def _moe_rank(args: argparse.Namespace) -> int:
    """One rank of a multi-GPU MoE row (under torchrun); rank 0 writes the JSON."""
    from halo.train.parallel import distributed

    ctx = distributed.init()
    try:
        conf = {**QWEN3_30B_A3B, "num_hidden_layers": args.moe_layers}
        parallel = tuple(args.moe_parallel or ())
        r = measure_moe(conf, ctx=ctx, parallel=parallel, steps=args.steps, warmup=args.warmup)
        if ctx.is_main and args.json:
            from halo.atomic import write_text

            write_text(args.json, json.dumps(r) + "\n")
    finally:
        distributed.shutdown(clean=True)
    return 0


def _free_bytes() -> float:
    import torch

    free, _ = torch.cuda.mem_get_info()
    return float(free)


def moe_suite(steps: int, warmup: int) -> tuple[list[dict[str, Any]], str]:
    """The one-GPU MoE row; with several GPUs, EP (all-to-all, DeepEP) and TP rows over all
    of them, each in its own torchrun. Returns (results, a note for the table)."""
    import subprocess
    import tempfile

    import torch

    from halo.train.parallel import ep

    gpus = torch.cuda.device_count()
    one = {**QWEN3_30B_A3B, "num_hidden_layers": moe_layers_that_fit(QWEN3_30B_A3B, _free_bytes())}
    try:
        results = [measure_moe(one, steps=steps, warmup=warmup)]
    except Exception as exc:  # an OOM, a kernel that does not load: a failed row, not no rows
        results = [{"run": "one GPU", "failed": " ".join(str(exc).split())[:200]}]
    torch.cuda.empty_cache()
    if gpus < 2:
        return results, "; one GPU here: no EP/TP rows"
    n = min(gpus, 8)
    tp = min(n, 4)  # Qwen3-30B-A3B's 4 key/value heads
    free = _free_bytes()
    # (row, flags, ranks the experts are split over: EP's n, or FSDP's n / tp under TP)
    runs = [
        (f"EP {n} all-to-all", [f"--expert_parallel_size={n}",
         "--runtime.parallelism.expert_parallel_backend=all_to_all"], n),
        (f"EP {n} DeepEP", [f"--expert_parallel_size={n}",
         "--runtime.parallelism.expert_parallel_backend=deepep"], n),
        (f"TP {tp}", [f"--tensor_parallel_size={tp}"], n // tp),
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="halo-moebench-") as tmp:
        for i, (run, flags, split) in enumerate(runs):
            if "DeepEP" in run and (why := ep.deepep_loads()):
                results.append({"run": run, "skipped": why})
                continue
            out = Path(tmp) / f"moe{i}.json"
            layers = moe_layers_that_fit(QWEN3_30B_A3B, free, ep=split)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={n}", "-m", "halo.train.measure.gpubench", "--moe-rank",
                   f"--moe-layers={layers}", f"--steps={steps}", f"--warmup={warmup}",
                   "--json", str(out), *[f"--moe-parallel={x}" for x in flags]]  # fmt: skip
            proc = subprocess.run(cmd, cwd=REPO, check=False)
            if out.is_file():
                results.append(json.loads(out.read_text()))
            else:
                results.append({"run": run, "failed": f"torchrun exit {proc.returncode}"})
    return results, ""


def _pct(x: float | None) -> str:
    return "n/a (unknown GPU peak)" if x is None else f"{100 * x:.1f}%"


def rows(result: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(benchmark, measured, budget, ok) rows, as ci/bench.py prints them."""
    out = []
    for p in result["points"]:
        tr, pl = p["trainer"], p["plain"]
        measured = (
            f"{tr['tokens_per_s']:.0f} vs {pl['tokens_per_s']:.0f} tok/s = {p['ratio']:.2f}x; "
            f"MFU {_pct(tr['mfu'])} vs {_pct(pl['mfu'])}"
        )
        name = (
            f"gpu: trainer SFT step / plain loop, ~1B Llama bf16, seq {p['seq_len']} x {p['batch']}"
        )
        out.append((name, measured, f">= {FLOOR}x", p["ratio"] >= FLOOR))
    return out + moe_rows(result.get("moe") or [], result.get("moe_note", ""))


def skipped_row(reason: str) -> tuple[str, str, str, bool]:
    return (
        "gpu: trainer SFT step / plain loop, ~1B Llama bf16",
        f"skipped: no GPU ({reason})",
        f">= {FLOOR}x",
        True,
    )


def skipped_moe_row(reason: str) -> tuple[str, str, str, bool]:
    return (
        "gpu: MoE SFT step, Qwen3-30B-A3B-shaped, bf16 (EP/TP rows with >= 2 GPUs)",
        f"skipped: no GPU ({reason})",
        "measured (anchor: torchtitan)",
        True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m halo.train.measure.gpubench", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seq-lens", type=int, nargs="+", default=list(SEQ_LENS))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the result as JSON here")
    parser.add_argument("--no-moe", action="store_true", help="only the dense rows")
    # One rank of a multi-GPU MoE row (moe_suite starts these under torchrun).
    parser.add_argument("--moe-rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--moe-layers", type=int, default=4, help=argparse.SUPPRESS)
    parser.add_argument("--moe-parallel", action="append", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.moe_rank:
        return _moe_rank(args)
    from halo.report import table

    reason = no_gpu_reason()
    if reason:
        print(f"gpu bench: skipped: no GPU ({reason})")
        result: dict[str, Any] = {"skipped": f"no GPU ({reason})", "ok": True}
        table_rows = [skipped_row(reason), skipped_moe_row(reason)]
    else:
        result = measure(tuple(args.seq_lens), args.steps, args.warmup)
        table_rows = rows(result)
        if args.json:  # the dense rows are kept even if the MoE ones run out of time
            from halo.atomic import write_text

            write_text(args.json, json.dumps(result, indent=2) + "\n")
        if not args.no_moe:
            import torch

            torch.cuda.empty_cache()
            result["moe"], result["moe_note"] = moe_suite(args.steps, args.warmup)
            table_rows = rows(result)
            result["ok"] = all(ok for *_, ok in table_rows)
        print(
            f"gpu: {result['gpu']}, attention {result['attention']}, "
            f"{result['params'] / 1e9:.2f}B parameters, {TOKENS_PER_STEP} tokens/step"
        )
    print(
        table(
            ("benchmark", "measured", "budget", "ok"),
            [
                (n, m, b, "skipped" if m.startswith("skipped") else "yes" if ok else "NO")
                for n, m, b, ok in table_rows
            ],
        )
    )
    print(FORMULA)
    print(ANCHOR)
    print(MOE_ANCHOR)
    if args.json:
        from halo.atomic import write_text

        write_text(args.json, json.dumps(result, indent=2) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
