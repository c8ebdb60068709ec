"""The DeviceMesh of a run and the sub-meshes each piece of parallelism uses.

One 1-D mesh of the world, and views of it (``_unflatten``: they share its root, so FSDP2's
sharding composes with the tensor- and expert-parallel DTensors cut from the others):

  grid     (dp_replicate, efsdp, cp, ep, tp): dp_shard = efsdp x ep, so an EP group is ep
           neighbouring ranks (one node's GPUs for ep <= GPUs per node: DeepEP's NVLink case)
  dense    (dp_replicate, dp_shard_cp, tp): FSDP2 shards dense weights over dp_shard_cp
           (cp ranks hold the same weights, as in torchtitan)
  sparse   (dp_replicate, efsdp_cp, ep, tp): ... and experts over efsdp_cp, the ranks that
           hold the same experts
  dp_cp    the ranks that hold different tokens (the routing statistics' all-reduce)

The data shard (which samples a rank reads) is the rank's (dp_replicate, efsdp, ep)
coordinate: tp and cp ranks read the same samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from halo.train.parallel.dims import Dims

NAMES = ("dp_replicate", "efsdp", "cp", "ep", "tp")


@dataclass(frozen=True)
class Mesh:
    dims: Dims
    grid: Any = None  # the views; None for one process
    dense: Any = None
    sparse: Any = None
    dp_cp: Any = None

    @property
    def distributed(self) -> bool:
        return self.grid is not None

    def fsdp(self) -> Any:
        """The mesh FSDP2 shards dense weights on (HSDP: replicate x shard), or None."""
        d = self.dims
        if self.dense is None or d.dp_replicate * d.dp_shard * d.cp == 1:
            return None
        return (
            self.dense["dp_replicate", "dp_shard_cp"]
            if d.dp_replicate > 1
            else self.dense["dp_shard_cp"]
        )

    def expert_fsdp(self) -> Any:
        """The mesh FSDP2 shards expert weights on, or None when no two ranks hold the same."""
        d = self.dims
        if self.sparse is None or d.dp_replicate * d.efsdp * d.cp == 1:
            return None
        return (
            self.sparse["dp_replicate", "efsdp_cp"]
            if d.dp_replicate > 1
            else self.sparse["efsdp_cp"]
        )

    def tp(self) -> Any:
        return self.dense["tp"] if self.dense is not None and self.dims.tp > 1 else None

    def ep(self) -> Any:
        return self.sparse["ep"] if self.sparse is not None and self.dims.ep > 1 else None

    def cp(self) -> Any:
        return self.grid["cp"] if self.grid is not None and self.dims.cp > 1 else None

    def token_group(self) -> Any:
        """The process group of the ranks holding different tokens; None when there is one."""
        return self.dp_cp.get_group() if self.dp_cp is not None and self.dp_cp.size() > 1 else None

    def data_shard(self, rank: int, world: int) -> tuple[int, int]:
        """(index, count) of this rank's share of each batch: tp and cp ranks read the same."""
        if self.grid is None:
            return rank, world
        d = self.dims
        r, f, _, e, _ = self.grid.get_coordinate()
        return (r * d.efsdp + f) * d.ep + e, d.dp

    def token_ranks(self) -> int:
        """Ranks that hold different tokens: what data-parallel gradients are averaged over."""
        return self.dims.dp * self.dims.cp


def build(dims: Dims, device: torch.device) -> Mesh:
    """The run's mesh (collective: every rank calls it; none for one process)."""
    if dims.world == 1:
        return Mesh(dims)
    from torch.distributed.device_mesh import init_device_mesh

    d = dims
    world = init_device_mesh(device.type, (d.world,), mesh_dim_names=("world",))
    grid = world._unflatten(0, (d.dp_replicate, d.efsdp, d.cp, d.ep, d.tp), NAMES)
    dense = world._unflatten(
        0, (d.dp_replicate, d.dp_shard * d.cp, d.tp), ("dp_replicate", "dp_shard_cp", "tp")
    )
    sparse = world._unflatten(
        0, (d.dp_replicate, d.efsdp * d.cp, d.ep, d.tp), ("dp_replicate", "efsdp_cp", "ep", "tp")
    )
    dp_cp = grid["dp_replicate", "efsdp", "cp", "ep"]._flatten("dp_cp")
    return Mesh(dims, grid, dense, sparse, dp_cp)
