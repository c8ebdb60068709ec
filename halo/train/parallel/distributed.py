"""The process group, model wrapping (DDP / FSDP2) and full state dicts: the one place that
talks to torch.distributed. One process runs without a process group at all."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from halo.errors import HaloError


@dataclass(frozen=True)
class Context:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    # The run's halo.train.parallel.mesh.Mesh when it has one (tp, cp or ep, or a MoE model).
    mesh: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def data_shard(self) -> tuple[int, int]:
        """(index, count) of this process's share of a batch: tp and cp ranks read the same."""
        return self.mesh.data_shard(self.rank, self.world) if self.mesh else (self.rank, self.world)

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            t = t.clone()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def any(self, flag: bool) -> bool:
        """True on every process if it is true on any (e.g. one of them got SIGTERM)."""
        if self.world == 1:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every process (a decision only rank 0 may make)."""
        if self.world == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def init(env: dict[str, str] | None = None) -> Context:
    env = dict(os.environ if env is None else env)
    world = int(env.get("WORLD_SIZE", "1"))
    rank = int(env.get("RANK", "0"))
    local = int(env.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group(
            backend="nccl" if cuda else "gloo",
            # A peer that died fails this rank's collective after the timeout: never a hang.
            timeout=datetime.timedelta(seconds=int(env.get("HALO_COLLECTIVE_TIMEOUT_S", "600"))),
            device_id=device if cuda else None,
        )
    return Context(rank, world, local, device)


def shutdown(clean: bool = False) -> None:
    """Tear the process group down; after a clean run, only once every rank got here.

    Ranks that destroy gloo's group while a peer still has collectives (an FSDP gather for
    the final checkpoint) in flight can abort at exit. After an error the peers may never
    arrive, so then there is no barrier.
    """
    if dist.is_initialized():
        if clean:
            dist.barrier()
        dist.destroy_process_group()


def resolve_mode(requested: str, world: int, cuda: bool) -> str:
    if requested == "auto":
        if world == 1:
            return "none"
        return "fsdp" if cuda else "ddp"
    if requested == "none" and world > 1:
        raise HaloError(
            f"runtime.parallel_mode: none cannot run {world} processes; use ddp or fsdp"
        )
    return requested


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a transformers causal LM (``model.model.layers``)."""
    for name, module in model.named_modules():
        if name.endswith("layers") and isinstance(module, nn.ModuleList):
            return list(module)
    raise HaloError(f"model: no decoder layers found in {type(model).__name__}")


def wrap(model: nn.Module, mode: str, ctx: Context, bf16: bool) -> nn.Module:
    """DDP or FSDP2 around ``model``; unchanged for one process.

    For FSDP the model may still be on the meta device: sharding first, then materialising
    (``materialise``), keeps every rank's memory to its shard.
    """
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(
            model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None
        )
    if mode == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if bf16 else torch.float32, reduce_dtype=torch.float32
        )
        # Shard block by block, then the root (embeddings, final norm, head).
        for layer in decoder_layers(model):
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    return model


def materialise(model: nn.Module, full: dict[str, torch.Tensor] | None, ctx: Context) -> None:
    """Give a sharded meta model real storage and rank 0's full weights, shard by shard."""
    model.to_empty(device=ctx.device)
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    set_model_state_dict(model, full if ctx.is_main else {}, options=opts)


def no_sync(model: nn.Module, last: bool) -> Any:
    """Skip the gradient all-reduce on all but the last micro-batch of an accumulation."""
    import contextlib

    if last or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full, unsharded state on the CPU (collective: every process must call it)."""
    return get_model_state_dict(model, options=_FULL)


def optimizer_state(model: nn.Module, optim: torch.optim.Optimizer) -> dict[str, Any]:
    return get_optimizer_state_dict(model, optim, options=_FULL)


def load_states(
    model: nn.Module,
    optim: torch.optim.Optimizer | None,
    model_sd: dict[str, torch.Tensor],
    optim_sd: dict[str, Any] | None,
) -> None:
    opts = StateDictOptions(full_state_dict=True, strict=False)
    missing = set(model_state_keys(model)) - set(model_sd)
    tied = {k for k in missing if k.endswith("lm_head.weight")}
    if missing - tied:
        raise HaloError(f"checkpoint is missing weights: {sorted(missing - tied)[:5]}")
    set_model_state_dict(model, model_sd, options=opts)
    if optim is not None and optim_sd is not None:
        set_optimizer_state_dict(
            model, optim, optim_sd, options=StateDictOptions(full_state_dict=True)
        )


def model_state_keys(model: nn.Module) -> list[str]:
    inner = getattr(model, "module", model)
    return list(inner.state_dict().keys())
