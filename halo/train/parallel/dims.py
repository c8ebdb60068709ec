"""The mesh's sizes: runtime.parallelism and the world size -> ``Dims``, checked (no torch).

The world is dp_replicate x dp_shard x cp x tp processes. Expert parallelism borrows ep of
the dp_shard ranks (as torchtitan does): those ranks hold different tokens, and each owns
experts / ep of every MoE layer; the dp_shard / ep ranks that hold the same experts shard
them with FSDP2 among themselves. Everything here runs before any process group exists:
`halo launch` checks it on the login node, the trainer again before it starts its group, so
a bad mesh is one line and exit 2 with nothing started.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from halo.errors import HaloError
from halo.train.models import source
from halo.train.models.arch import MOE_TYPES, Arch
from halo.train.parallel import support

if TYPE_CHECKING:
    from halo.train.config import Config

KEY = "runtime.parallelism"


@dataclass(frozen=True)
class Dims:
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    ep: int = 1

    @property
    def world(self) -> int:
        return self.dp_replicate * self.dp_shard * self.cp * self.tp

    @property
    def dp(self) -> int:
        """Ranks that hold different samples (the batch is split over these)."""
        return self.dp_replicate * self.dp_shard

    @property
    def efsdp(self) -> int:
        """dp_shard ranks that hold the same experts (FSDP2 shards experts over these x cp)."""
        return self.dp_shard // self.ep

    @property
    def model_parallel(self) -> bool:
        """A mesh beyond data parallelism: the model itself is split."""
        return self.cp > 1 or self.tp > 1 or self.ep > 1

    def sizes(self) -> dict[str, int]:
        return {
            "dp_replicate": self.dp_replicate,
            "dp_shard": self.dp_shard,
            "cp": self.cp,
            "tp": self.tp,
            "ep": self.ep,
        }

    def describe(self) -> str:
        """ "dp_replicate 1 x dp_shard 16 x cp 1 x tp 1 = 16 processes; ep 8 within dp_shard"."""
        s = self.sizes()
        line = " x ".join(f"{k} {s[k]}" for k in ("dp_replicate", "dp_shard", "cp", "tp"))
        line += f" = {self.world} process{'es' if self.world > 1 else ''}"
        if self.ep > 1:
            line += (
                f"; ep {self.ep} within dp_shard (experts FSDP-sharded over {self.efsdp * self.cp})"
            )
        return line


def resolve(cfg: Config, world: int) -> Dims:
    """The sizes for ``world`` processes (unset ones take what the others leave)."""
    par, mode = cfg.runtime.parallelism, cfg.runtime.parallel_mode
    cp, tp, ep = par.context_parallel_size, par.tensor_parallel_size, par.expert_parallel_size
    if ep * tp > world:
        raise HaloError(
            f"{KEY}: expert_parallel_size {ep} x tensor_parallel_size {tp} = {ep * tp} is "
            f"larger than the world of {world} process{'es' if world > 1 else ''}"
        )
    if mode == "none" and world > 1:
        raise HaloError(
            f"runtime.parallel_mode: none cannot run {world} processes; use ddp or fsdp"
        )
    rep, shard = par.data_parallel_replicate_size, par.data_parallel_shard_size
    fixed = cp * tp
    if rep is None:
        # parallel_mode ddp: every data-parallel rank a replica (no sharding), unless the
        # shard size is given or experts need dp_shard ranks to spread over.
        rep = 1
        if mode == "ddp" and shard is None and ep == 1 and world % fixed == 0:
            rep = world // fixed
    if shard is None:
        if world % (rep * fixed):
            raise HaloError(
                f"{KEY}: the world of {world} processes does not divide by data_parallel_replicate"
                f" {rep} x context_parallel {cp} x tensor_parallel {tp} = {rep * fixed}"
            )
        shard = world // (rep * fixed)
    dims = Dims(rep, shard, cp, tp, ep)
    if dims.world != world:
        raise HaloError(
            f"{KEY}: dp_replicate {rep} x dp_shard {shard} x cp {cp} x tp {tp} = {dims.world} "
            f"does not match the world of {world} processes"
        )
    if ep > 1 and shard % ep:
        raise HaloError(
            f"{KEY}.expert_parallel_size: {ep} does not divide the data-parallel shard size "
            f"{shard} (expert parallelism borrows dp_shard ranks; dp_shard = world / "
            f"(dp_replicate x cp x tp))"
        )
    if ep > 1 and mode == "ddp":
        raise HaloError(
            f"runtime.parallel_mode: ddp replicates every weight; expert_parallel_size {ep} "
            "shards the experts (use parallel_mode auto or fsdp)"
        )
    return dims


def check_model(cfg: Config, dims: Dims, arch: Arch | None, method: str | None) -> None:
    """What the mesh asks of the model, the data and the method (one line each, the first)."""
    par = cfg.runtime.parallelism
    if method is not None:
        allowed = support.dims(method)
        for dim, flag in support.FLAG.items():
            if getattr(dims, dim) > 1 and dim not in allowed:
                raise HaloError(
                    f"{KEY}.{flag}: {method} trains with {' '.join(allowed)}, not {dim} "
                    "(see `halo launch --list`)"
                )
    if dims.cp > 1:
        step = 2 * dims.cp
        if cfg.data.max_seq_len % step:
            raise HaloError(
                f"data.max_seq_len: {cfg.data.max_seq_len} does not divide by 2 x "
                f"context_parallel_size = {step} (each rank takes a head and a tail chunk)"
            )
        if cfg.data.packing:
            raise HaloError(
                "data.packing: packed rows restart their positions, which context parallelism's "
                "ring attention cannot see; set data.packing: false"
            )
    moe_keys = cfg.model.router_aux_loss_coef is not None or cfg.model.router_z_loss_coef > 0
    moe_flags = dims.ep > 1 or par.expert_parallel_backend != "auto" or moe_keys
    if arch is None:
        return
    kind = arch.model_type or "the model"
    if moe_flags and not arch.is_moe:
        what = (
            f"{KEY}.expert_parallel_size {dims.ep}"
            if dims.ep > 1
            else f"{KEY}.expert_parallel_backend"
            if par.expert_parallel_backend != "auto"
            else "model.router_aux_loss_coef"
            if cfg.model.router_aux_loss_coef is not None
            else "model.router_z_loss_coef"
        )
        raise HaloError(f"{what}: {kind} is a dense model (no experts to route)")
    if dims.ep > 1:
        if arch.model_type not in MOE_TYPES:
            raise HaloError(
                f"{KEY}.expert_parallel_size: expert parallelism supports {', '.join(MOE_TYPES)},"
                f" not {kind}"
            )
        if arch.experts % dims.ep:
            raise HaloError(
                f"{KEY}.expert_parallel_size: {dims.ep} does not divide the model's "
                f"{arch.experts} experts"
            )
    if dims.tp > 1:
        for count, what in ((arch.heads, "attention heads"), (arch.kv_heads, "key/value heads")):
            if count % dims.tp:
                raise HaloError(
                    f"{KEY}.tensor_parallel_size: {dims.tp} does not divide the model's "
                    f"{count} {what}"
                )
        if arch.model_type == "gpt_oss":
            raise HaloError(
                f"{KEY}.tensor_parallel_size: gpt_oss's attention sinks are per head and not "
                "split by tensor parallelism here; use expert_parallel_size"
            )


def check(cfg: Config, method: str | None, world: int) -> Dims:
    """The mesh for ``world`` processes, checked against the model (its config read as data)
    and the method: what `halo launch` and the trainer run before any process group starts."""
    dims = resolve(cfg, world)
    check_model(cfg, dims, source.arch(cfg), method)
    return dims


def uses_mesh(dims: Dims, arch: Arch | None) -> bool:
    """Whether the run goes through halo.train.parallel: a split model, a hybrid data-parallel
    mesh, or a MoE model whose blocks halo trains (routing losses, grouped matmul)."""
    hybrid = dims.dp_replicate > 1 and dims.dp_shard > 1
    moe = arch is not None and arch.is_moe and arch.model_type in MOE_TYPES
    return dims.model_parallel or hybrid or moe
