"""A second, private Docker engine for a test: its own data root, exec root, socket and pidfile.

"Another machine" for reproducibility: nothing of the shared engine's images, layers or build
cache is visible to it. No bridge and no iptables (like the shared engine here); it starts
its own supervised containerd under its exec root, in its own namespaces. Stopped and its
folders removed when the test ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path


def _unmount_below(root: Path) -> None:
    """Lazily unmount whatever a killed engine left mounted under ``root`` (deepest first)."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    points = [line.split()[1] for line in mounts if len(line.split()) > 1]
    for point in sorted((p for p in points if p.startswith(str(root))), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


class PrivateEngine:
    """A running dockerd; ``env`` points the docker CLI (and halo) at it. ``stop()`` removes it."""

    def __init__(self, name: str) -> None:
        """Start it; RuntimeError (for the caller to turn into a skip) when that is not possible."""
        dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
        if not Path(dockerd).exists():
            raise RuntimeError("no dockerd on this machine")
        if os.geteuid() != 0:
            raise RuntimeError("starting a second dockerd needs root")
        # The socket path must stay short (108 bytes), so everything lives in one /tmp folder.
        self.top = Path(tempfile.mkdtemp(prefix=f"halo-{name}-", dir="/tmp"))
        sock, ns = self.top / "docker.sock", f"halo-test-{self.top.name}"
        self._log = (self.top / "dockerd.log").open("w")
        self.proc = subprocess.Popen(
            [
                dockerd,
                f"--data-root={self.top / 'data'}",
                f"--exec-root={self.top / 'exec'}",
                f"--host=unix://{sock}",
                f"--pidfile={self.top / 'dockerd.pid'}",
                f"--containerd-namespace={ns}",
                f"--containerd-plugins-namespace={ns}-plugins",
                "--bridge=none",
                "--iptables=false",
                "--ip-masq=false",
                "--log-level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.env = {"DOCKER_HOST": f"unix://{sock}"}
        deadline = time.monotonic() + 60
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.top / "dockerd.log").read_text()[-1500:]
                self.stop()
                raise RuntimeError(f"the second dockerd did not start: {tail}")
            time.sleep(0.5)

    def _answers(self) -> bool:
        proc = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            env={**os.environ, **self.env},
            capture_output=True,
            check=False,
        )
        return proc.returncode == 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        _unmount_below(self.top)
        shutil.rmtree(self.top, ignore_errors=True)
