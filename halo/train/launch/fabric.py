"""NCCL's network for a run (`runtime.fabric`): the environment it needs, and a check, before
anything starts, that a requested fabric is really there.

NCCL quietly falls back to TCP sockets when a network plugin does not load; a job that asked
for EFA would then train at a fraction of its speed without saying so. Here a missing plugin
or device is one error line instead. Pure functions of their inputs, except `check`, which
looks at this host (the libraries it can load, the devices in sysfs).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from halo.errors import HaloError

# aws-ofi-nccl: NCCL_NET_PLUGIN=ofi makes NCCL dlopen libnccl-net-ofi.so (older releases
# install it as libnccl-net.so); libfabric's EFA provider underneath.
EFA = {
    "NCCL_NET_PLUGIN": "ofi",
    "FI_PROVIDER": "efa",
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "FI_EFA_FORK_SAFE": "1",
    "RDMAV_FORK_SAFE": "1",
    "NCCL_PROTO": "simple",
}
# Plain TCP: no InfiniBand, NCCL's own socket transport.
SOCKET = {"NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket"}
OFI_LIBRARIES = ("libnccl-net-ofi.so", "libnccl-net.so")
SYS_INFINIBAND = Path("/sys/class/infiniband")


def env(fabric: str, socket_ifname: str | None, collective_timeout_s: int) -> dict[str, str]:
    """The defaults the fabric implies; runtime.env is applied on top by the caller."""
    out: dict[str, str] = {}
    if fabric == "efa":
        out.update(EFA)
    elif fabric == "socket":
        out.update(SOCKET)
    if socket_ifname:
        out["NCCL_SOCKET_IFNAME"] = socket_ifname
        out["GLOO_SOCKET_IFNAME"] = socket_ifname
    # A peer that died makes NCCL's watchdog abort the collective after the timeout
    # (torch's init_process_group timeout, passed by halo.train.parallel.distributed) instead of
    # waiting forever.
    out["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    out["HALO_COLLECTIVE_TIMEOUT_S"] = str(collective_timeout_s)
    return out


def _loads(name: str) -> str | None:
    """None when the shared library loads (with its own dependencies), else why not."""
    try:
        ctypes.CDLL(name, mode=os.RTLD_LAZY | ctypes.RTLD_LOCAL)
    except OSError as exc:
        return str(exc)
    return None


def efa_devices(sys_ib: Path = SYS_INFINIBAND) -> list[str]:
    """The RDMA devices in sysfs whose kernel driver is efa."""
    if not sys_ib.is_dir():
        return []
    found = []
    for dev in sorted(sys_ib.iterdir()):
        driver = dev / "device" / "driver"
        if driver.exists() and driver.resolve().name == "efa":
            found.append(dev.name)
    return found


def check(fabric: str, run_env: dict[str, str], sys_ib: Path = SYS_INFINIBAND) -> None:
    """Raise when ``fabric`` is requested but cannot work on this host."""
    if fabric != "efa":
        return
    plugin = run_env.get("NCCL_NET_PLUGIN", "ofi")
    names = OFI_LIBRARIES if plugin == "ofi" else (plugin, f"libnccl-net-{plugin}.so")
    problems = [p for p in (_loads(n) for n in names) if p is not None]
    if len(problems) == len(names):
        raise HaloError(
            f"runtime.fabric: efa needs the aws-ofi-nccl plugin ({' or '.join(names)}) "
            f"on the library path, and it does not load: {problems[0]}"
        )
    libfabric = _loads("libfabric.so.1")
    if libfabric is not None:
        raise HaloError(f"runtime.fabric: efa needs libfabric (libfabric.so.1): {libfabric}")
    if not efa_devices(sys_ib):
        raise HaloError(
            f"runtime.fabric: efa requested, but no EFA device is in {sys_ib} "
            "(use runtime.fabric: socket or auto on this host)"
        )
