"""The mesh and the per-GPU memory plan a dry run prints, from the config alone (no torch).

The architecture comes from ``model.config``, or ``config.json`` of the model folder or of
the Hugging Face cache, read as data; for the seeds' Hub ids, from halo.train.models.known
when neither has it (halo.train.models.source). Memory is what the trainer keeps per GPU:

- weights, gradients and AdamW's two moments in fp32 (4 + 4 + 8 bytes a parameter), each
  sharded as the weight is: attention and dense MLPs over tp, then FSDP2 over dp_shard x cp;
  experts over ep, then FSDP2 over the dp_shard / ep ranks that hold the same experts x cp;
- the weights FSDP2 gathers for compute: one decoder layer, two in flight (the next one is
  prefetched), in the compute precision;
- activations: an estimate per token and layer of what backward keeps (inputs of each matmul,
  the attention output, the MLP's gate/up/product; flash attention keeps no score matrix),
  for a micro-batch of micro_batch_size x max_seq_len / cp tokens, plus the fp32 logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from halo.report import table
from halo.train.models.arch import Arch, from_config
from halo.train.models.source import source
from halo.train.parallel.dims import Dims

if TYPE_CHECKING:
    from halo.train.config import Config

GIB = 1024**3


@dataclass(frozen=True)
class Memory:
    """Per GPU: parameters held (fp32), and bytes by kind."""

    params: float
    weights: float
    grads: float
    optimizer: float
    gathered: float
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.gathered + self.activations


def memory(cfg: Config, dims: Dims, a: Arch) -> Memory:
    c = a.counts()
    fsdp = dims.dp_shard * dims.cp
    # The LM head is split by tp (colwise); embeddings, norms and routers are not.
    head = 0 if a.tied else a.vocab * a.hidden
    split_tp = c["attention"] + c["mlp"] + head
    whole = c["embeddings"] - head + c["router"]
    dense = (split_tp / dims.tp + whole) / fsdp
    experts = c["experts"] / dims.ep / (dims.efsdp * dims.cp)
    params = dense + experts
    compute = 2 if cfg.training.precision == "bf16" else 4
    per_layer = (a.attention_params() + a.dense_mlp_params() * (a.layers - a.moe_layers)) / max(
        a.layers, 1
    ) / dims.tp + (a.experts * a.expert_params() / dims.ep if a.moe_layers else 0)
    gathered = 2 * per_layer * compute if fsdp > 1 or dims.dp_replicate > 1 else 0.0
    return Memory(
        params=params,
        weights=4 * params,
        grads=4 * params,
        optimizer=8 * params,
        gathered=gathered,
        activations=activations(cfg, dims, a, compute),
    )


def micro_tokens(cfg: Config, dims: Dims) -> tuple[int, int]:
    """(sequences, tokens) of one micro-batch on one GPU."""
    t = cfg.training
    share = max(t.global_batch_size // max(dims.dp, 1), 1)
    seqs = t.micro_batch_size or share
    return seqs, seqs * cfg.data.max_seq_len // dims.cp


def activations(cfg: Config, dims: Dims, a: Arch, compute: int) -> float:
    _, tokens = micro_tokens(cfg, dims)
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    attn = 3 * a.hidden + (2 * q + 2 * kv) / dims.tp
    mlp = a.hidden + 4 * a.intermediate / dims.tp
    moe = a.hidden + a.top_k * (2 * a.hidden + 4 * a.moe_intermediate) + 2 * a.experts
    dense_layers = a.layers - a.moe_layers
    per_token = a.layers * attn + dense_layers * mlp + a.moe_layers * moe
    if cfg.model.activation_checkpointing:
        # Only each layer's input is kept; one layer's activations are rebuilt at a time.
        per_token = a.layers * a.hidden + per_token / max(a.layers, 1)
    logits = tokens * a.vocab * (compute + 4)  # the logits, and their fp32 log-softmax
    return tokens * per_token * compute + logits


def _gib(n: float) -> str:
    return f"{n / GIB:.1f}"


def _billions(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.1f}M"


def describe(cfg: Config, dims: Dims) -> list[str]:
    """The `# parallelism` section of a dry run: mesh, model, memory per GPU."""
    par = cfg.runtime.parallelism
    lines = ["# parallelism", f"mesh: {dims.describe()}"]
    if dims.ep > 1:
        backend = par.expert_parallel_backend
        how = (
            "DeepEP where it loads on the GPUs, else all-to-all over torch.distributed"
            if backend == "auto"
            else backend
        )
        lines.append(f"expert parallelism: {how}")
    found = source(cfg)
    if found is None:
        lines.append(
            f"memory plan: not shown (no config.json for {cfg.model.name_or_path} here: a model "
            "folder, or the Hugging Face cache seeded with `halo hf-cache seed`)"
        )
        return lines
    a = from_config(found.conf)
    what = (
        f"model: {a.model_type or '?'} from {found.where}, {_billions(a.total_params())} parameters"
    )
    if a.is_moe:
        what += (
            f", {_billions(a.active_params())} active per token; {a.experts} experts, top "
            f"{a.top_k}, in {a.moe_layers} of {a.layers} layers"
        )
    lines.append(what)
    mem = memory(cfg, dims, a)
    seqs, tokens = micro_tokens(cfg, dims)
    precision = cfg.training.precision
    ckpt = ", activation checkpointing" if cfg.model.activation_checkpointing else ""
    rows = [
        ["weights (fp32)", _billions(mem.params), _gib(mem.weights)],
        ["gradients (fp32)", _billions(mem.params), _gib(mem.grads)],
        ["optimizer (AdamW, 2 x fp32)", _billions(mem.params), _gib(mem.optimizer)],
        [f"gathered for compute (1 layer x 2, {precision})", "", _gib(mem.gathered)],
        [
            f"activations (~, {seqs} x {cfg.data.max_seq_len // dims.cp} tokens{ckpt})",
            f"{tokens} tokens",
            _gib(mem.activations),
        ],
        ["total", "", _gib(mem.total)],
    ]
    lines.append("# memory per GPU")
    lines.append(table(["what", "parameters", "GiB"], rows))
    return lines
