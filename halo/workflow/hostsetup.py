"""What a hosted CI runner (Ubuntu 24.04, a sudo-capable user) needs before the steps.

`mmdebstrap`: the CPU base is made by mmdebstrap, which as a non-root user runs in its
unshare mode. That needs newuidmap (uidmap), subordinate id ranges for the user, Debian's
archive keyring (an Ubuntu host has only Ubuntu's), and user namespaces, which Ubuntu 24.04
restricts through AppArmor (kernel.apparmor_restrict_unprivileged_userns=1): the runner is a
throwaway VM, so lifting that restriction there is the documented remedy.
`registry`: Debian's/Ubuntu's docker-registry package, a real OCI registry on
127.0.0.1:5000 for the publishing tests (the package starts it as a service).

The plan is data (`plan()`), so it can be read and tested; `apply()` runs it.
"""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from halo.errors import HaloError
from halo.report import say

USERNS_SYSCTL = Path("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
SUBID_RANGE = "100000-165535"
REGISTRY = ("127.0.0.1", 5000)
PACKAGES = {
    "mmdebstrap": ("mmdebstrap", "uidmap", "debian-archive-keyring"),
    "registry": ("docker-registry",),
}


@dataclass(frozen=True)
class HostState:
    user: str
    is_root: bool
    userns_restricted: bool
    has_subids: bool


def current_state() -> HostState:
    user = getpass.getuser()
    restricted = USERNS_SYSCTL.is_file() and USERNS_SYSCTL.read_text().strip() == "1"

    def listed(path: str) -> bool:
        try:
            return any(line.split(":")[0] == user for line in Path(path).read_text().splitlines())
        except OSError:
            return False

    return HostState(
        user, os.geteuid() == 0, restricted, listed("/etc/subuid") and listed("/etc/subgid")
    )


def plan(features: Sequence[str], state: HostState) -> list[list[str]]:
    unknown = [f for f in features if f not in PACKAGES]
    if unknown:
        raise HaloError(
            f"host-setup: unknown feature '{unknown[0]}' (known: {', '.join(PACKAGES)})"
        )
    sudo = [] if state.is_root else ["sudo"]
    packages = [p for f in features for p in PACKAGES[f]]
    if not packages:
        return []
    cmds = [
        [*sudo, "apt-get", "update", "-qq"],
        [
            *sudo,
            "env",
            "DEBIAN_FRONTEND=noninteractive",
            "apt-get",
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            *packages,
        ],
    ]
    if "mmdebstrap" in features and not state.is_root:
        if state.userns_restricted:
            cmds.append([*sudo, "sysctl", "-w", "kernel.apparmor_restrict_unprivileged_userns=0"])
        if not state.has_subids:
            cmds.append(
                [
                    *sudo,
                    "usermod",
                    "--add-subuids",
                    SUBID_RANGE,
                    "--add-subgids",
                    SUBID_RANGE,
                    state.user,
                ]
            )
    return cmds


def _registry_up(timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(REGISTRY, timeout=2).close()
            return True
        except OSError:
            time.sleep(1)
    return False


def apply(features: Sequence[str], dry_run: bool = False) -> list[list[str]]:
    cmds = plan(features, current_state())
    for argv in cmds:
        say(" ".join(argv))
        if dry_run:
            continue
        if subprocess.run(argv, check=False).returncode != 0:
            raise HaloError(f"host-setup: `{' '.join(argv)}` failed")
    if "registry" in features and not dry_run and not _registry_up(30):
        raise HaloError(
            f"host-setup: no registry answers on {REGISTRY[0]}:{REGISTRY[1]} after installing docker-registry"
        )
    return cmds
