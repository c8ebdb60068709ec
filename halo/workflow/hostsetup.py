"""What a hosted CI runner (Ubuntu 24.04, a sudo-capable user) needs before the steps.

`mmdebstrap`: the CPU base is made by mmdebstrap, which as a non-root user runs in its
unshare mode. That needs newuidmap (uidmap), subordinate id ranges for the user, Debian's
archive keyring (an Ubuntu host has only Ubuntu's), and user namespaces, which Ubuntu 24.04
restricts through AppArmor (kernel.apparmor_restrict_unprivileged_userns=1): the runner is a
throwaway VM, so lifting that restriction there is the documented remedy.
`qemu`: qemu-user-static for the arm64 image's base and example (binfmt_misc).
`registry`: Debian's/Ubuntu's docker-registry package, a real OCI registry on
127.0.0.1:5000 for the publishing tests. The package's own configuration asks for htpasswd
credentials; the tests need what `.ci/run` starts (loopback only, no auth, deletes allowed),
so that configuration replaces it and the service is restarted.

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
REGISTRY_CONFIG = Path("/etc/docker/registry/config.yml")
REGISTRY_YAML = """version: 0.1
storage:
  filesystem:
    rootdirectory: /var/lib/docker-registry
  delete:
    enabled: true
http:
  addr: 127.0.0.1:5000
"""
PACKAGES = {
    # apt-utils: apt-ftparchive, the flat local repository bases are made offline from.
    "mmdebstrap": ("mmdebstrap", "uidmap", "debian-archive-keyring", "apt-utils"),
    "registry": ("docker-registry",),
    # arm64 programs through binfmt_misc: installing registers them on a systemd host.
    "qemu": ("qemu-user-static", "binfmt-support"),
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


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    stdin: str | None = None

    def __str__(self) -> str:
        return " ".join(self.argv) + (" <<EOF" if self.stdin is not None else "")


def plan(features: Sequence[str], state: HostState) -> list[Command]:
    unknown = [f for f in features if f not in PACKAGES]
    if unknown:
        raise HaloError(
            f"host-setup: unknown feature '{unknown[0]}' (known: {', '.join(PACKAGES)})"
        )
    sudo = () if state.is_root else ("sudo",)
    packages = tuple(p for f in features for p in PACKAGES[f])
    if not packages:
        return []
    cmds = [
        Command((*sudo, "apt-get", "update", "-qq")),
        Command(
            (*sudo, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-qq",
             "--no-install-recommends", *packages)
        ),
    ]  # fmt: skip
    if "mmdebstrap" in features and not state.is_root:
        if state.userns_restricted:
            cmds.append(
                Command((*sudo, "sysctl", "-w", "kernel.apparmor_restrict_unprivileged_userns=0"))
            )
        if not state.has_subids:
            cmds.append(
                Command(
                    (*sudo, "usermod", "--add-subuids", SUBID_RANGE, "--add-subgids", SUBID_RANGE,
                     state.user)
                )
            )  # fmt: skip
    if "registry" in features:
        cmds.append(Command((*sudo, "tee", str(REGISTRY_CONFIG)), REGISTRY_YAML))
        cmds.append(Command((*sudo, "systemctl", "restart", "docker-registry")))
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


def apply(features: Sequence[str], dry_run: bool = False) -> list[Command]:
    cmds = plan(features, current_state())
    for cmd in cmds:
        say(str(cmd))
        if dry_run:
            continue
        proc = subprocess.run(
            cmd.argv, input=cmd.stdin, text=True, stdout=subprocess.DEVNULL, check=False
        )
        if proc.returncode != 0:
            raise HaloError(f"host-setup: `{cmd}` failed (exit {proc.returncode})")
    if "registry" in features and not dry_run and not _registry_up(30):
        raise HaloError(
            f"host-setup: no registry answers on {REGISTRY[0]}:{REGISTRY[1]} after installing docker-registry"
        )
    return cmds
