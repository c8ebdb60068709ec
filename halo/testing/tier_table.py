"""The test tiers as data: name, pytest marker, folder, what the container needs.

Data only, below the image catalog (which validates an image's `tiers` against the markers)
and below halo.testing.tiers (which runs them): it imports nothing that runs anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from halo.errors import HaloError
from halo.rollout.servers import ServerKind
from halo.rollout.servers import server as rollout_server


@dataclass(frozen=True)
class Tier:
    name: str
    marker: str
    path: str
    gpus: bool = False
    parallel: bool = False  # pytest-xdist workers; GPU and server tiers share one device, so no
    server: str = ""  # the rollout server it talks to (halo.rollout.servers)

    @property
    def server_kind(self) -> ServerKind | None:
        return rollout_server(self.server) if self.server else None


TIERS = {
    t.name: t
    for t in (
        Tier("cpu", "cpu", "tests/cpu", parallel=True),
        Tier("gpu-core", "gpu_core", "tests/gpu_core", gpus=True),
        Tier("gpu-full", "gpu_full", "tests/gpu_full", gpus=True),
        Tier("rollout-vllm", "rollout_vllm", "tests/rollout", server="vllm"),
        Tier("rollout-sglang", "rollout_sglang", "tests/rollout", server="sglang"),
    )
}


def tier(name: str) -> Tier:
    key = name.replace("_", "-")
    if key not in TIERS:
        raise HaloError(f"unknown test tier '{name}' (known: {', '.join(TIERS)})")
    return TIERS[key]
