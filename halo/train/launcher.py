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
from halo.train.registry import MethodSpec

ENTRY = "halo.train.run"


@dataclass(frozen=True)
class Plan:
    launcher: str
    nproc: int
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


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
    launcher = choose_launcher(spec, cfg, nproc)
    if launcher == "python" and nproc > 1:
        raise HaloError(
            f"runtime.launcher: python runs one process; --nproc {nproc} needs torchrun"
        )
    entry = ["-m", ENTRY, "--method", spec.name, "--config", str(config_path), *extra]
    notes = []
    if launcher == "python":
        argv = [python, *entry]
    elif launcher == "torchrun":
        # torchrun through this interpreter, so it works in any venv and inside images. One
        # node: rendezvous on loopback, since a container without a network (docker run
        # --network none) cannot resolve its own hostname.
        argv = [
            python,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--local-addr=127.0.0.1",
            f"--nproc-per-node={nproc}",
            *entry,
        ]
    else:
        if not accelerate_installed:
            raise HaloError(
                f"runtime.launcher: accelerate is requested but the accelerate package is not "
                f"installed for {python}"
            )
        argv = [python, "-m", "accelerate.commands.launch", f"--num_processes={nproc}", *entry]
    env = dict(cfg.runtime.env)
    if launcher == "torchrun" and "GLOO_SOCKET_IFNAME" not in {*env, *os.environ}:
        # The same reason: gloo would otherwise look its interface up by the hostname.
        env["GLOO_SOCKET_IFNAME"] = "lo"
    if isinstance(cfg.runtime.devices, list):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in cfg.runtime.devices)
    return Plan(launcher, nproc, argv, env, notes)
