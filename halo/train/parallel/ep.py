"""Expert parallelism: one dispatch/combine interface, two backends.

An EP group of P ranks owns the E experts of a MoE layer in blocks: rank p holds experts
[p E/P, (p+1) E/P), the layout of a DTensor sharded on dim 0 over the group (halo.train.
parallel.build). ``dispatch`` sends each (token, expert) route to the rank that owns the
expert and returns the rows that arrived, grouped by local expert, with each row's routing
weight; the block runs its experts on them, scales each row by its weight, and ``combine``
sends the rows back and sums a token's rows at its source. Both steps are differentiable.

- ``AllToAll``: torch.distributed.all_to_all_single (gloo and NCCL: the CPU tier's path).
  With a group of one (ep 1) it is the same code with no communication, so ep 1 and ep > 1
  share every line but the collectives.
- ``DeepEP``: DeepSeek's kernels, NVLink within a node, NVSHMEM/RDMA across nodes; a token
  goes once to each rank it needs (not once per expert), in bf16.

``choose`` picks the backend (``auto``: DeepEP on GPUs where it loads) and says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from halo.errors import HaloError


@dataclass
class Routed:
    """The rows a rank's experts compute: grouped by local expert (``counts`` rows each)."""

    tokens: torch.Tensor  # (rows, hidden)
    weights: torch.Tensor  # (rows,) each row's routing weight
    counts: list[int]  # rows per local expert
    state: Any  # what combine needs to send the rows home


class Dispatcher(Protocol):
    name: str
    num_experts: int
    size: int  # ranks in the EP group
    rank: int

    def dispatch(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> Routed:
        """x (tokens, hidden); idx, weights (tokens, top_k): each token's experts."""

    def combine(self, y: torch.Tensor, routed: Routed) -> torch.Tensor:
        """y (rows, hidden), already weighted -> (tokens, hidden): each token's rows summed."""


class _AllToAll(torch.autograd.Function):
    """all_to_all_single whose backward is the reverse exchange."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any
    ) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def owners(expert: torch.Tensor, num_experts: int, size: int) -> torch.Tensor:
    """The EP rank that holds each expert (block layout: Shard(0) over the group)."""
    return torch.div(expert, num_experts // size, rounding_mode="floor")


class AllToAll:
    """Routes over torch.distributed.all_to_all_single; ``group`` None: one rank, no exchange."""

    name = "all_to_all"

    def __init__(self, num_experts: int, group: Any = None) -> None:
        self.num_experts = num_experts
        self.group = group
        self.size = dist.get_world_size(group) if group is not None else 1
        self.rank = dist.get_rank(group) if group is not None else 0
        self.local = num_experts // self.size

    def dispatch(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> Routed:
        tokens, top_k = idx.shape
        flat = idx.reshape(-1)
        # Routes ordered by expert: by owning rank, then by its local expert (block layout).
        order = torch.argsort(
            owners(flat, self.num_experts, self.size) * self.num_experts + flat, stable=True
        )
        source = torch.div(order, top_k, rounding_mode="floor")  # each route's token
        rows, row_w = x[source], weights.reshape(-1)[order]
        per_expert = torch.bincount(flat, minlength=self.num_experts)
        if self.size == 1:
            counts = per_expert.tolist()
            return Routed(rows, row_w, counts, (source, None, None, None, tokens))
        send = per_expert.view(self.size, self.local)
        got = torch.empty_like(send)
        dist.all_to_all_single(got, send.contiguous(), group=self.group)  # (source rank, local)
        send_splits, recv_splits = send.sum(1).tolist(), got.sum(1).tolist()
        rows = _AllToAll.apply(rows, recv_splits, send_splits, self.group)
        row_w = _AllToAll.apply(row_w, recv_splits, send_splits, self.group)
        # Arrived ordered by (source rank, local expert): regroup by local expert.
        local = torch.arange(self.local, device=x.device).repeat(self.size)
        regroup = torch.argsort(torch.repeat_interleave(local, got.reshape(-1)), stable=True)
        state = (source, send_splits, recv_splits, regroup, tokens)
        return Routed(rows[regroup], row_w[regroup], got.sum(0).tolist(), state)

    def combine(self, y: torch.Tensor, routed: Routed) -> torch.Tensor:
        source, send_splits, recv_splits, regroup, tokens = routed.state
        if regroup is not None:
            y = y[torch.argsort(regroup)]  # back to (source rank, local expert) order
            y = _AllToAll.apply(y, send_splits, recv_splits, self.group)
        out = y.new_zeros((tokens, y.shape[-1]))
        return out.index_add(0, source, y)


class _DeepEPDispatch(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor, box: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        buffer = box["buffer"]
        per_rank, per_rdma, per_expert, in_rank, _ = buffer.get_dispatch_layout(
            idx, box["num_experts"]
        )
        recv_x, recv_idx, recv_w, counts, handle, _ = buffer.dispatch(
            x=x,
            num_tokens_per_rank=per_rank,
            num_tokens_per_rdma_rank=per_rdma,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            topk_idx=idx,
            topk_weights=weights,
        )
        box.update(handle=handle, recv_idx=recv_idx, counts=counts)
        ctx.box = box
        return recv_x, recv_w

    @staticmethod
    def backward(ctx: Any, grad_x: torch.Tensor, grad_w: torch.Tensor) -> Any:  # type: ignore[override]
        # The reverse of a dispatch is a combine (a token's copies summed at its source).
        box = ctx.box
        gx, gw, _ = box["buffer"].combine(
            x=grad_x.contiguous(), handle=box["handle"], topk_weights=grad_w.contiguous()
        )
        return gx, gw, None, None


class _DeepEPCombine(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, box: dict[str, Any]) -> torch.Tensor:  # type: ignore[override]
        out, _, _ = box["buffer"].combine(x=y.contiguous(), handle=box["handle"])
        ctx.box = box
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        # The reverse of a combine is a dispatch along the same layout (the cached handle).
        back, _, _, _, _, _ = ctx.box["buffer"].dispatch(
            x=grad.contiguous(), handle=ctx.box["handle"]
        )
        return back, None


class DeepEP:
    """DeepEP's normal (high-throughput) kernels: bf16 rows, one copy per destination rank."""

    name = "deepep"

    def __init__(self, num_experts: int, group: Any, nvl_bytes: int = 1 << 30) -> None:
        import deep_ep

        self.deep_ep = deep_ep
        self.num_experts = num_experts
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.local = num_experts // self.size
        # RDMA buffers only when the group leaves the node (NVSHMEM across nodes).
        per_node = torch.cuda.device_count()
        rdma = 1 << 30 if self.size > per_node else 0
        self.buffer = deep_ep.Buffer(group, num_nvl_bytes=nvl_bytes, num_rdma_bytes=rdma)

    def dispatch(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> Routed:
        box: dict[str, Any] = {"buffer": self.buffer, "num_experts": self.num_experts}
        recv_x, recv_w = _DeepEPDispatch.apply(
            x.to(torch.bfloat16), weights.float(), idx.to(self.deep_ep.topk_idx_t), box
        )
        # A received token carries its top-k with -1 for experts of other ranks: one row per
        # (token, local expert), grouped by local expert.
        recv_idx = box["recv_idx"]
        row, slot = (recv_idx >= 0).nonzero(as_tuple=True)
        local = recv_idx[row, slot]
        order = torch.argsort(local, stable=True)
        row, slot = row[order], slot[order]
        counts = torch.bincount(local, minlength=self.local).tolist()
        state = (box, row, recv_x.shape[0], x.dtype)
        return Routed(recv_x[row].to(x.dtype), recv_w[row, slot].to(x.dtype), counts, state)

    def combine(self, y: torch.Tensor, routed: Routed) -> torch.Tensor:
        box, row, received, dtype = routed.state
        per_token = y.new_zeros((received, y.shape[-1])).index_add(0, row, y)
        return _DeepEPCombine.apply(per_token.to(torch.bfloat16), box).to(dtype)


def deepep_loads() -> str | None:
    """None when DeepEP imports here, else why not (one line)."""
    try:
        import deep_ep  # noqa: F401
    except Exception as exc:  # an ImportError, or a failed JIT/NCCL check at import
        return f"deep_ep does not load ({' '.join(str(exc).split())[:120]})"
    return None


def choose(
    backend: str, num_experts: int, group: Any, device: torch.device, bf16: bool
) -> tuple[Dispatcher, str]:
    """The backend for one EP group, and the line that says why it was chosen."""
    if group is None or dist.get_world_size(group) == 1:
        return AllToAll(num_experts), "all_to_all (one EP rank: no exchange)"
    if backend == "all_to_all":
        return AllToAll(
            num_experts, group
        ), "all_to_all (runtime.parallelism.expert_parallel_backend)"
    problem = None
    if device.type != "cuda":
        problem = "no CUDA GPU"
    elif not bf16:
        problem = "DeepEP moves bf16 rows; training.precision is fp32"
    else:
        problem = deepep_loads()
    if problem is None:
        return DeepEP(num_experts, group), "deepep (NVLink within a node, NVSHMEM across nodes)"
    if backend == "deepep":
        raise HaloError(f"runtime.parallelism.expert_parallel_backend: deepep: {problem}")
    return AllToAll(num_experts, group), f"all_to_all (auto: {problem})"
