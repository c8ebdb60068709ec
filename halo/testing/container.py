"""The one place that knows how a Halo image is run: `docker run` flags for tiers and jobs.

No network, no credentials (nothing from the host environment is passed unless named in
``env``), the checkout mounted at /workspace, scratch (HF caches, outputs) under
$HALO_SCRATCH mounted at /scratch, the host's user so files written there stay the host's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from halo.images.docker import Docker
from halo.paths import find_repo, scratch_root

WORKSPACE = "/workspace"
SCRATCH = "/scratch"
# How NCCL leaves the node. No fabric: plain TCP sockets, NCCL's IB transport off. EFA: the
# host's /dev/infiniband and NCCL over Libfabric through the aws-ofi-nccl plugin ("ofi"),
# sockets only on real interfaces (the exclude list keeps loopback and docker bridges out).
FABRICS: dict[str, dict[str, str]] = {
    "none": {"NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket"},
    "efa": {
        "NCCL_NET": "Libfabric",
        "NCCL_NET_PLUGIN": "ofi",
        "NCCL_IB_DISABLE": "0",
        "NCCL_SOCKET_IFNAME": "^lo,docker,veth",
    },
}


@dataclass(frozen=True)
class RunSpec:
    image: str
    argv: Sequence[str]
    gpus: bool = False
    network: str = "none"
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: Sequence[tuple[Path, str, bool]] = ()  # (host, container, read_only)
    workspace_writable: bool = False
    fabric: str = "none"  # a key of FABRICS; only GPU runs talk NCCL
    cuda_devices: str = "all"  # "all" or a comma list of GPU indices


def docker_run_args(spec: RunSpec, repo: Path, scratch: Path) -> list[str]:
    args = ["--rm", "--init", f"--network={spec.network}", "--ipc=host", "--shm-size=2g"]
    fabric_env: dict[str, str] = {}
    if spec.gpus:
        # NCCL and RDMA pin memory; unprivileged CPU-only hosts may refuse to raise memlock.
        # docker splits --gpus on commas unless the device list is quoted inside the value.
        gpus = "all" if spec.cuda_devices == "all" else f'"device={spec.cuda_devices}"'
        args += ["--gpus", gpus, "--ulimit", "memlock=-1", "--ulimit", "stack=67108864"]
        if spec.fabric not in FABRICS:
            raise ValueError(f"fabric {spec.fabric!r}: expected one of {sorted(FABRICS)}")
        if spec.fabric == "efa":
            args += ["--device=/dev/infiniband"]
        fabric_env = FABRICS[spec.fabric]
    args += ["--user", f"{os.getuid()}:{os.getgid()}"]
    ro = "" if spec.workspace_writable else ":ro"
    args += ["-v", f"{repo}:{WORKSPACE}{ro}", "-v", f"{scratch}:{SCRATCH}", "-w", WORKSPACE]
    for host, target, read_only in spec.mounts:
        args += ["-v", f"{host}:{target}{':ro' if read_only else ''}"]
    env = {
        "HOME": f"{SCRATCH}/home",
        "HF_HOME": f"{SCRATCH}/hf",
        "HF_HUB_OFFLINE": "1",
        "HALO_SCRATCH": SCRATCH,
        "PYTHONDONTWRITEBYTECODE": "1",
        **fabric_env,
        **spec.env,
    }
    for k, v in sorted(env.items()):
        args += ["-e", f"{k}={v}"]
    return [*args, spec.image, *spec.argv]


def built_image_ref(name: str) -> str:
    """A catalog image's moving tag (``NAME:TAG`` passes through), refusing one not built here."""
    from halo.errors import HaloError
    from halo.images.catalog import load_catalog

    ref = name if ":" in name else load_catalog(find_repo()).image(name).moving_ref
    if Docker.discover().image_id(ref) is None:
        hint = f"nox -s build-{name}" if ":" not in name else "halo image build <name>"
        raise HaloError(f"{ref}: image not built here; run `{hint}`")
    return ref


def run_spec(spec: RunSpec) -> int:
    repo = find_repo()
    scratch = scratch_root()
    (scratch / "home").mkdir(parents=True, exist_ok=True)
    docker = Docker.discover()
    return docker.run(docker_run_args(spec, repo, scratch)).returncode


def run_in_image(
    image_ref: str,
    argv: list[str],
    *,
    mounts: Sequence[tuple[Path, str, bool]] = (),
    env: Mapping[str, str] | None = None,
) -> int:
    return run_spec(RunSpec(image=image_ref, argv=argv, mounts=mounts, env=env or {}))
