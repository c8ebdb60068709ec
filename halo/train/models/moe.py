"""Hugging Face MoE blocks over one dispatch/combine interface, with their routing losses.

transformers' Qwen3-MoE and gpt-oss blocks hold every expert in 3-D parameters and loop over
the experts on one device. ``adapt`` replaces each block with a ``MoeBlock`` that keeps the
block's own router (its routing: softmax-then-top-k for Qwen3, top-k-then-softmax for
gpt-oss) and the same parameters under the same names and shapes, so state dicts,
checkpoints and exports stay Hugging Face's. The block then

  routes      the router's top-k experts and weights per token,
  dispatches  each (token, expert) route to the rank that holds the expert
              (halo.train.parallel.ep; one rank: the same code, no exchange),
  computes    the local experts with one grouped matmul (halo.train.models.grouped),
  combines    each row times its routing weight, summed back at the token's source.

The load-balancing loss is Switch Transformer's, as transformers computes it (all layers'
routes pooled: E x sum_e f_e P_e, f the share of routes to expert e, P its mean router
probability), but over every rank's tokens: route counts are summed over the ranks that
hold other tokens before f is taken, so a step of N ranks has the loss of one process over
the same global batch (with gradient accumulation: over each micro-step's tokens on all
ranks; a micro-step then covers other tokens than one process's micro-batch does). Padding
counts in no statistic. The z-loss (ST-MoE) is the mean squared log-sum-exp of the router
logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from halo.train.models import grouped
from halo.train.models.arch import MOE_TYPES
from halo.train.parallel.ep import AllToAll, Dispatcher

# transformers' block class -> (model type, the router's attribute name)
BLOCKS = {"Qwen3MoeSparseMoeBlock": ("qwen3_moe", "gate"), "GptOssMLP": ("gpt_oss", "router")}


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward scales the gradient (expert weights: see ``Experts``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:  # type: ignore[override]
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        return grad * ctx.scale, None


def _local(p: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (expert parallelism: this rank's experts), else the tensor."""
    return p.to_local() if hasattr(p, "to_local") else p


class Experts(nn.Module):
    """One layer's experts in transformers' layout (same names, shapes and meaning).

    qwen3_moe: gate_up_proj (E, 2I, H) and down_proj (E, H, I), applied as x W^T; gate and up
    are the two halves. gpt_oss: gate_up_proj (E, H, 2I) and down_proj (E, I, H), applied as
    x W, with biases; gate and up interleave, clamped, glu = gate sigmoid(1.702 gate).

    Under expert parallelism each rank's expert weights are gathered from the tokens of its
    whole EP group, so their gradient is that group's sum where every dense weight's is a
    mean over ranks; ``grad_scale`` (1 / ep) makes them the same kind of quantity.
    """

    def __init__(self, kind: str, hf: nn.Module) -> None:
        super().__init__()
        self.kind = kind
        self.gate_up_proj = hf.gate_up_proj
        self.down_proj = hf.down_proj
        if kind == "gpt_oss":
            self.gate_up_proj_bias = hf.gate_up_proj_bias
            self.down_proj_bias = hf.down_proj_bias
            self.alpha, self.limit = float(hf.alpha), float(hf.limit)
        else:
            self.act_fn = hf.act_fn
        self.impl: grouped.Impl = "auto"
        self.grad_scale = 1.0

    def _w(self, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        w = _local(p)
        if self.grad_scale != 1.0:
            w = _ScaleGrad.apply(w, self.grad_scale)
        return w.to(dtype)

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        gate_up, down = self._w(self.gate_up_proj, x.dtype), self._w(self.down_proj, x.dtype)
        if self.kind == "gpt_oss":
            h = grouped.mm(x, gate_up, counts, self.impl)
            h = h + grouped.bias(self._w(self.gate_up_proj_bias, x.dtype), counts)
            gate = h[..., ::2].clamp(max=self.limit)
            up = h[..., 1::2].clamp(min=-self.limit, max=self.limit)
            h = (up + 1) * (gate * torch.sigmoid(gate * self.alpha))
            out = grouped.mm(h, down, counts, self.impl)
            return out + grouped.bias(self._w(self.down_proj_bias, x.dtype), counts)
        h = grouped.mm(x, gate_up.transpose(1, 2), counts, self.impl)
        gate, up = h.chunk(2, dim=-1)
        return grouped.mm(self.act_fn(gate) * up, down.transpose(1, 2), counts, self.impl)


@dataclass
class Routing:
    """What the routing losses and the load log share across a model's blocks."""

    num_experts: int
    aux_coef: float = 0.0
    z_coef: float = 0.0
    # The ranks holding other tokens (all-reduce of the route counts) and how many they are
    # (gradients are averaged over them; the routing loss is a sum over them).
    group: Any = None
    ranks: int = 1
    # The micro-batch's real tokens (B*T, 1 for a token, 0 for padding), set before its
    # forward: padding is routed like any token but counts in no statistic.
    mask: torch.Tensor | None = None
    # Per step, for the log: route counts per expert (summed over layers and micro-batches),
    # the loss values, and how many micro-batches added to them.
    counts: torch.Tensor | None = None
    layer_max: float = 0.0
    aux: float = 0.0
    z: float = 0.0
    passes: int = 0


@dataclass
class Record:
    """One forward of one block: route counts (no gradient), router probability sums and
    squared log-sum-exps (with gradients), and the tokens they cover."""

    counts: torch.Tensor
    prob_sum: torch.Tensor
    z_sum: torch.Tensor
    tokens: int


class MoeBlock(nn.Module):
    """A transformers MoE block, same parameters, routed through a ``Dispatcher``."""

    def __init__(self, kind: str, router_name: str, router: nn.Module, experts: Experts) -> None:
        super().__init__()
        self.kind, self.router_name = kind, router_name
        setattr(self, router_name, router)
        self.experts = experts
        self.num_experts = int(router.num_experts)
        self.dispatcher: Dispatcher = AllToAll(self.num_experts)
        self.records: list[Record] = []
        self.routing = Routing(self.num_experts)

    def forward(self, hidden: torch.Tensor) -> Any:
        shape = hidden.shape
        x = hidden.reshape(-1, shape[-1])
        logits, weights, idx = getattr(self, self.router_name)(x)
        if torch.is_grad_enabled():
            self._record(logits, idx)
        routed = self.dispatcher.dispatch(x, idx, weights)
        y = self.experts(routed.tokens, routed.counts)
        y = y * routed.weights.unsqueeze(-1).to(y.dtype)
        out = self.dispatcher.combine(y, routed).reshape(shape)
        # gpt-oss's decoder layer unpacks (hidden, router scores).
        return (out, weights) if self.kind == "gpt_oss" else out

    def _record(self, logits: torch.Tensor, idx: torch.Tensor) -> None:
        logits = logits.float()
        mask = self.routing.mask
        if mask is not None and mask.numel() == logits.shape[0]:
            keep = mask.reshape(-1).to(device=logits.device, dtype=torch.bool)
            logits, idx = logits[keep], idx[keep]
        probs = torch.softmax(logits, dim=-1)
        counts = torch.bincount(idx.reshape(-1), minlength=self.num_experts).float()
        z = (
            torch.logsumexp(logits, dim=-1).pow(2).sum()
            if self.routing.z_coef
            else logits.new_zeros(())
        )
        self.records.append(Record(counts.detach(), probs.sum(0), z, int(logits.shape[0])))


def blocks(model: nn.Module) -> list[MoeBlock]:
    return [m for m in model.modules() if isinstance(m, MoeBlock)]


def adapt(model: nn.Module, routing: Routing) -> list[MoeBlock]:
    """Replace transformers' MoE blocks of ``model`` in place (meta tensors too); the blocks."""
    found = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            spec = BLOCKS.get(type(child).__name__)
            if spec is None:
                continue
            kind, router_name = spec
            block = MoeBlock(
                kind, router_name, getattr(child, router_name), Experts(kind, child.experts)
            )
            block.routing = routing
            setattr(parent, name, block)
            found.append(block)
    return found


def is_halo_moe(conf: Any) -> bool:
    """A config whose MoE blocks ``adapt`` replaces."""
    return getattr(conf, "model_type", None) in MOE_TYPES


def begin(model: nn.Module, mask: torch.Tensor | None = None) -> None:
    """Before a micro-batch's forward: drop what earlier forwards (no-grad passes, activation
    checkpointing's recompute) left, and say which of its tokens are real."""
    for b in blocks(model):
        b.records.clear()
        b.routing.mask = mask


def router_loss(model: nn.Module, micro_batches: int) -> torch.Tensor | None:
    """This rank's share of the routing losses of the forward just done, scaled as the loop
    scales its loss (gradients are averaged over ``routing.ranks``); None for a dense model."""
    found = blocks(model)
    recs = [(i, r) for i, b in enumerate(found) for r in b.records]
    if not recs:
        return None
    routing = found[0].routing
    e = routing.num_experts
    per_layer = torch.zeros(len(found), e, device=recs[0][1].counts.device)
    for i, r in recs:
        per_layer[i] += r.counts
    prob_sum = sum(r.prob_sum for _, r in recs)
    z_sum = sum(r.z_sum for _, r in recs)
    tokens = float(sum(r.tokens for _, r in recs))
    assert isinstance(prob_sum, torch.Tensor) and isinstance(z_sum, torch.Tensor)
    # One all-reduce: per-layer counts, probability sums (for the log), tokens, z.
    stats = torch.cat(
        [
            per_layer.flatten(),
            prob_sum.detach(),
            prob_sum.new_tensor([tokens]),
            z_sum.detach().reshape(1),
        ]
    )
    if routing.group is not None:
        dist.all_reduce(stats, group=routing.group)
    n = per_layer.numel()
    layer_counts = stats[:n].view(len(found), e)
    counts, all_probs, all_tokens, all_z = (
        layer_counts.sum(0),
        stats[n : n + e],
        stats[n + e],
        stats[n + e + 1],
    )
    share = counts / all_tokens
    aux_mine = e * (share * prob_sum).sum() / all_tokens
    z_mine = z_sum / all_tokens
    _tally(
        routing,
        layer_counts,
        float(e * (share * all_probs).sum() / all_tokens),
        float(all_z / all_tokens),
    )
    loss = routing.aux_coef * aux_mine + routing.z_coef * z_mine
    return loss * (routing.ranks / micro_batches)


def _tally(routing: Routing, layer_counts: torch.Tensor, aux: float, z: float) -> None:
    total = layer_counts.sum(0).cpu()
    routing.counts = total if routing.counts is None else routing.counts + total
    mean = layer_counts.mean(1).clamp(min=1e-9)
    routing.layer_max = max(routing.layer_max, float((layer_counts.max(1).values / mean).max()))
    routing.aux += aux
    routing.z += z
    routing.passes += 1


def step_stats(model: nn.Module) -> dict[str, float]:
    """The routing log of the update just done (and reset): the load-balancing loss, and how
    uneven the experts' loads were (max and min over experts of routes / mean; the worst
    layer's max), every process the same values."""
    found = blocks(model)
    if not found or found[0].routing.passes == 0:
        return {}
    r = found[0].routing
    assert r.counts is not None
    mean = float(r.counts.mean().clamp(min=1e-9))
    out = {
        "moe_aux_loss": r.aux / r.passes,
        "moe_load_max": float(r.counts.max()) / mean,
        "moe_load_min": float(r.counts.min()) / mean,
        "moe_layer_load_max": r.layer_max,
    }
    if r.z_coef:
        out["moe_z_loss"] = r.z / r.passes
    r.counts, r.layer_max, r.aux, r.z, r.passes = None, 0.0, 0.0, 0.0, 0
    return out
