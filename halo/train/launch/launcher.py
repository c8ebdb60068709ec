"""The exact command that runs a method: plain python, torchrun, or accelerate.

A pure function of (method, config, nproc, interpreter); `halo launch` then either prints it
(--dry-run) or replaces itself with it, so signals reach the trainer directly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from halo.errors import HaloError
from halo.train.config import Config
from halo.train.launch import fabric
from halo.train.methods.registry import MethodSpec

ENTRY = "halo.train.run"


@dataclass(frozen=True)
class Plan:
    launcher: str
    nproc: int
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    nnodes: int = 1
    accumulation: int = 1
    notes: list[str] = field(default_factory=list)


def multinode(cfg: Config) -> bool:
    return cfg.runtime.nnodes > 1 or cfg.runtime.rdzv.endpoint is not None


def torchrun_args(cfg: Config, nproc: int) -> list[str]:
    """torchrun's flags: one node standalone on loopback, or c10d across nodes.

    One node rendezvouses on loopback, since a container without a network (docker run
    --network none) cannot resolve its own hostname. Across nodes, c10d on the endpoint (the
    first node hosts the store), and no restarts: a rank that dies ends the job, with
    torchrun's failure summary naming it, rather than the survivors waiting for it.
    """
    rt = cfg.runtime
    if not multinode(cfg):
        return ["--standalone", "--local-addr=127.0.0.1", f"--nproc-per-node={nproc}"]
    if rt.rdzv.endpoint is None:
        raise HaloError(
            f"runtime.rdzv.endpoint: {rt.nnodes} nodes need a rendezvous endpoint HOST:PORT "
            "(--rdzv-endpoint; the first node's address)"
        )
    conf = f"join_timeout={rt.rdzv.join_timeout_s},last_call_timeout={rt.rdzv.last_call_timeout_s}"
    args = [
        f"--nnodes={rt.nnodes}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rt.rdzv.endpoint}",
        f"--rdzv-id={rt.rdzv.id or rt.job_name}",
        f"--rdzv-conf={conf}",
        "--max-restarts=0",
    ]
    if rt.node_rank is not None:
        args.append(f"--node-rank={rt.node_rank}")
    host = rt.rdzv.endpoint.rsplit(":", 1)[0].strip("[]")
    if host in ("localhost", "::1") or host.startswith("127."):
        # A loopback endpoint: every node is this machine. Each agent then publishes loopback
        # as its address rather than its hostname, which a container without a network
        # (docker run --network none) cannot resolve.
        args.append("--local-addr=127.0.0.1")
    return args


def check_batch(cfg: Config, nproc: int) -> int:
    """Gradient accumulation steps: global batch / (micro batch x world size), whole or an error.

    The global batch is the config's and never changes with the world size, so the same
    config trains the same curve on one process or on many nodes.
    """
    t, nnodes = cfg.training, cfg.runtime.nnodes
    world = nnodes * nproc
    where = f"{nnodes} node(s) x {nproc} process(es)"
    if t.global_batch_size % world:
        raise HaloError(
            f"training.global_batch_size: {t.global_batch_size} does not divide over {where} "
            f"= {world} processes"
        )
    share = t.global_batch_size // world
    micro = t.micro_batch_size or share
    if share % micro:
        raise HaloError(
            f"training.micro_batch_size: {micro} does not divide the per-process share "
            f"{share} (global_batch_size {t.global_batch_size} over {where})"
        )
    return share // micro


def choose_launcher(spec: MethodSpec, cfg: Config, nproc: int) -> str:
    if cfg.runtime.launcher != "auto":
        return cfg.runtime.launcher
    if spec.launcher:
        return spec.launcher
    return "torchrun" if nproc > 1 else "python"


def plan(
    spec: MethodSpec,
    cfg: Config,
    config_path: Path,
    nproc: int,
    extra: list[str],
    python: str,
    accelerate_installed: bool,
) -> Plan:
    if nproc < 1:
        raise HaloError(f"--nproc: expected a positive number, got {nproc}")
    if cfg.runtime.nnodes < 1:
        raise HaloError(f"--nnodes: expected a positive number, got {cfg.runtime.nnodes}")
    accumulation = check_batch(cfg, nproc)
    launcher = choose_launcher(spec, cfg, nproc * cfg.runtime.nnodes)
    if launcher == "python" and nproc > 1:
        raise HaloError(
            f"runtime.launcher: python runs one process; --nproc {nproc} needs torchrun"
        )
    entry = ["-m", ENTRY, "--method", spec.name, "--config", str(config_path), *extra]
    notes = []
    if launcher == "python":
        argv = [python, *entry]
    elif launcher == "torchrun":
        # torchrun through this interpreter, so it works in any venv and inside images.
        argv = [python, "-m", "torch.distributed.run", *torchrun_args(cfg, nproc), *entry]
    else:
        if not accelerate_installed:
            raise HaloError(
                f"runtime.launcher: accelerate is requested but the accelerate package is not "
                f"installed for {python}"
            )
        argv = [python, "-m", "accelerate.commands.launch", f"--num_processes={nproc}", *entry]
    rt = cfg.runtime
    if rt.nnodes > 1 and launcher != "torchrun":
        raise HaloError(f"runtime.launcher: {launcher} cannot run {rt.nnodes} nodes; use torchrun")
    # One process has no collectives, so no network settings either.
    world = nproc * rt.nnodes
    net = fabric.env(rt.fabric, rt.socket_ifname, rt.collective_timeout_s) if world > 1 else {}
    env = {**net, **rt.env}
    if (
        launcher == "torchrun"
        and not multinode(cfg)
        and "GLOO_SOCKET_IFNAME" not in {*env, *os.environ}
    ):
        # The same reason: gloo would otherwise look its interface up by the hostname.
        env["GLOO_SOCKET_IFNAME"] = "lo"
    if isinstance(cfg.runtime.devices, list):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in cfg.runtime.devices)
    return Plan(launcher, nproc, argv, env, cfg.runtime.nnodes, accumulation, notes)
