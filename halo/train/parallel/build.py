"""A model placed on the mesh, in the order PyTorch's APIs compose (as torchtitan does):

1. built on the meta device (no rank holds a full copy beside its shard; one process: on
   the device, weights and all);
2. transformers' MoE blocks replaced by halo's (halo.train.models.moe; the same parameters);
3. tensor parallelism (halo.train.parallel.tp: DTensors on the tp mesh);
4. expert parallelism: each block's expert weights a DTensor sharded on dim 0 over the ep
   mesh, its dispatcher chosen (halo.train.parallel.ep);
5. FSDP2: experts over the ranks that hold the same experts, each decoder layer, then the
   root, over dp_shard x cp (HSDP with dp_replicate);
6. weights: rank 0's full state dict, broadcast and cut to every rank's shards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from halo.train.config import Config
from halo.train.models import hf, moe
from halo.train.models.arch import from_config
from halo.train.parallel import dims as dimensions
from halo.train.parallel import distributed, ep, tp
from halo.train.parallel.mesh import Mesh
from halo.train.parallel.mesh import build as build_mesh


@dataclass
class Layout:
    """How this run's models are placed, and what the loop needs to know of it."""

    mesh: Mesh
    moe: bool
    # Which EP backend was chosen and why (one line for the log).
    backend: str = ""

    @property
    def sharded(self) -> bool:
        return self.mesh.fsdp() is not None

    @property
    def mode(self) -> str:
        """The world line's mode: "fsdp2 dp_shard 4, ep 2"."""
        d = self.mesh.dims
        parts = [f"{k} {v}" for k, v in d.sizes().items() if v > 1]
        head = "fsdp2" if self.sharded else "mesh"
        return f"{head} {', '.join(parts)}" if parts else "none"


def layout(
    cfg: Config, conf: Any, ctx: distributed.Context, method: str | None
) -> tuple[Layout, distributed.Context] | None:
    """The run's layout and a context that knows its mesh; None: the plain paths serve."""
    d = dimensions.resolve(cfg, ctx.world)
    arch = from_config(conf.to_dict())
    dimensions.check_model(cfg, d, arch, method)
    if not dimensions.uses_mesh(d, arch):
        return None
    mesh = build_mesh(d, ctx.device)
    return Layout(mesh, moe.is_halo_moe(conf)), dataclasses.replace(ctx, mesh=mesh)


def routing(cfg: Config, conf: Any, lay: Layout) -> moe.Routing:
    coef = cfg.model.router_aux_loss_coef
    return moe.Routing(
        num_experts=int(getattr(conf, "num_experts", 0) or getattr(conf, "num_local_experts", 0)),
        aux_coef=float(coef if coef is not None else getattr(conf, "router_aux_loss_coef", 0.0)),
        z_coef=cfg.model.router_z_loss_coef,
        group=lay.mesh.token_group(),
        ranks=lay.mesh.token_ranks(),
    )


def _expert_params(blocks: list[moe.MoeBlock]) -> set[nn.Parameter]:
    return {p for b in blocks for p in b.experts.parameters()}


def place(
    model: nn.Module, cfg: Config, conf: Any, lay: Layout, ctx: distributed.Context, bf16: bool
) -> nn.Module:
    """Steps 2-5 on ``model`` (meta or real); returns it."""
    blocks = moe.adapt(model, routing(cfg, conf, lay)) if lay.moe else []
    for b in blocks:
        b.experts.impl = cfg.runtime.parallelism.grouped_mm
    m = lay.mesh
    if m.tp() is not None:
        tp.apply(model, m.tp())
    ep_mesh = m.ep()
    if blocks and ep_mesh is not None:
        from torch.distributed.tensor import Shard, distribute_tensor

        backend = cfg.runtime.parallelism.expert_parallel_backend
        dispatcher, lay.backend = ep.choose(
            backend, blocks[0].num_experts, ep_mesh.get_group(), ctx.device, bf16
        )
        for b in blocks:
            for name, p in list(b.experts.named_parameters(recurse=False)):
                shard = nn.Parameter(distribute_tensor(p.data, ep_mesh, [Shard(0)]))
                b.experts.register_parameter(name, shard)
            b.experts.grad_scale = 1.0 / ep_mesh.size()
            b.dispatcher = dispatcher
    fsdp_mesh = m.fsdp()
    if fsdp_mesh is None:
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if bf16 else torch.float32, reduce_dtype=torch.float32
    )
    expert_mesh = m.expert_fsdp() if ep_mesh is not None else None
    # Experts nobody else holds (ep = dp_shard x cp) are not FSDP's: they are EP's alone.
    ignored = _expert_params(blocks) if ep_mesh is not None and expert_mesh is None else set()
    for layer in distributed.decoder_layers(model):
        if expert_mesh is not None:
            for b in (x for x in layer.modules() if isinstance(x, moe.MoeBlock)):
                fully_shard(b.experts, mesh=expert_mesh, mp_policy=mp)
        fully_shard(layer, mesh=fsdp_mesh, mp_policy=mp, ignored_params=ignored or None)
    fully_shard(model, mesh=fsdp_mesh, mp_policy=mp, ignored_params=ignored or None)
    return model


def models(
    cfg: Config,
    conf: Any,
    attention: str,
    ctx: distributed.Context,
    lay: Layout,
    bf16: bool,
    reference: bool,
    build: Callable[..., nn.Module] = hf.build,
) -> tuple[nn.Module, nn.Module | None]:
    """(policy, reference or None) on the mesh."""
    seed = cfg.training.seed
    if not lay.mesh.distributed:
        base = build(cfg.model, conf, attention, seed).to(ctx.device)
        ref = None
        if reference:
            import copy

            ref = copy.deepcopy(base).requires_grad_(False).eval()
            place(ref, cfg, conf, lay, ctx, bf16)
        return place(base, cfg, conf, lay, ctx, bf16).train(), ref
    full = build(cfg.model, conf, attention, seed).state_dict() if ctx.is_main else None

    def one() -> nn.Module:
        m = build(cfg.model, conf, attention, seed, device="meta")
        place(m, cfg, conf, lay, ctx, bf16)
        distributed.materialise(m, full, ctx)
        hf.restore_buffers(m, ctx.device)
        return m

    policy = one().train()
    ref = one().requires_grad_(False).eval() if reference else None
    return policy, ref


def adapt_method(lay: Layout, method: Any, pad_id: int, log: Callable[[str], None]) -> None:
    """What the method's batches need under this mesh (cp: sequence shards), and the log."""
    log(f"mesh: {lay.mesh.dims.describe()}")
    if lay.backend:
        log(f"expert parallelism: {lay.backend}")
    cp_mesh = lay.mesh.cp()
    if cp_mesh is not None:
        from halo.train.parallel import cp

        cp.wrap_method(method, cp_mesh, pad_id)
