"""One run per job folder, on any file system a cluster shares (NFS, Lustre): no flock.

The lock is a file created with O_CREAT|O_EXCL (atomic on NFSv3+ and Lustre) holding who
took it: host, pid, the process's start time and the host's boot id (so a reused pid is not
taken for the owner), and the Slurm job id when there is one. A heartbeat thread touches it;
a lock is stale when its host is this host and its process is gone, or when its heartbeat is
older than ``STALE_AFTER_S`` (a crashed node never refreshes it). A stale lock is taken over
with a line saying so, so a crashed run never holds a folder forever.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from halo.errors import HaloError

LOCK_NAME = ".halo-run.lock"
# How often the owner touches its lock, and how old a heartbeat may get before another host
# takes the lock (several missed beats: an overloaded node or a slow NFS server is not dead).
HEARTBEAT_S = 30.0
STALE_AFTER_S = float(os.environ.get("HALO_LOCK_STALE_AFTER_S", "300"))


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' where /proc has none)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # The command name (field 2) may hold spaces; the fields after its ')' are plain.
    return stat.rsplit(")", 1)[-1].split()[19]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return True


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    boot_id: str
    start_time: str
    slurm_job_id: str | None

    @classmethod
    def me(cls) -> Owner:
        pid = os.getpid()
        return cls(
            socket.gethostname(), pid, _boot_id(), _start_time(pid), os.environ.get("SLURM_JOB_ID")
        )

    @classmethod
    def parse(cls, data: Any) -> Owner | None:
        if not isinstance(data, dict):
            return None
        try:
            job = data.get("slurm_job_id")
            return cls(
                str(data["host"]),
                int(data["pid"]),
                str(data.get("boot_id", "")),
                str(data.get("start_time", "")),
                None if job is None else str(job),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def describe(self) -> str:
        job = f", Slurm job {self.slurm_job_id}" if self.slurm_job_id else ""
        return f"host {self.host}, pid {self.pid}{job}"

    def dead_here(self) -> bool:
        """On this host and certainly gone (or its pid now belongs to another process)."""
        if self.host != socket.gethostname():
            return False
        if self.boot_id and self.boot_id != _boot_id():
            return True  # the host rebooted since
        if not _alive(self.pid):
            return True
        return bool(self.start_time) and self.start_time != _start_time(self.pid)


def _read(path: Path) -> tuple[Owner | None, float | None]:
    """(owner, heartbeat age in seconds); (None, None) when there is no lock file."""
    try:
        text = path.read_text()
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError):
        return None, 0.0
    try:
        return Owner.parse(json.loads(text)), age
    except ValueError:
        return None, age  # being written, or garbage: judged by its heartbeat alone


def stale_reason(owner: Owner | None, age: float) -> str | None:
    if owner is not None and owner.dead_here():
        return f"its process ({owner.describe()}) is gone"
    if age > STALE_AFTER_S:
        who = owner.describe() if owner else "an unreadable owner"
        return f"its heartbeat ({who}) is {age:.0f}s old"
    return None


class JobLock:
    """Held by the run that writes into ``job_dir``; see the module docstring."""

    def __init__(self, job_dir: Path, log: Callable[[str], None] = print) -> None:
        self.path = job_dir / LOCK_NAME
        self.log = log
        self.me = Owner.me()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as fh:
            json.dump(self.me.__dict__, fh, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        return True

    def _take_over(self, reason: str, owner: Owner | None) -> bool:
        # Rename the stale lock aside first: of several runs taking it over, only one rename
        # succeeds. Then O_EXCL decides again, so exactly one of them ends up holding it.
        aside = self.path.with_name(f"{LOCK_NAME}.stale.{os.getpid()}")
        try:
            self.path.rename(aside)
        except FileNotFoundError:
            return self._create()
        if Owner.parse(_json(aside)) != owner:
            # Another run took the lock over between our read and the rename: give it back.
            with contextlib.suppress(OSError):
                os.link(aside, self.path)
            aside.unlink(missing_ok=True)
            return False
        aside.unlink(missing_ok=True)
        if not self._create():
            return False
        self.log(f"job lock: took over {self.path} from a dead run: {reason}")
        return True

    def acquire(self) -> None:
        """Take the lock, or raise one line naming the run that holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            if self._create():
                break
            owner, age = _read(self.path)
            if age is None:
                continue  # released meanwhile: try again
            reason = stale_reason(owner, age)
            if reason is None:
                who = owner.describe() if owner else "another run"
                raise HaloError(
                    f"{self.path.parent}: in use by another run ({who}); wait for it to end, "
                    f"or remove {self.path} if that run is certainly gone"
                )
            if self._take_over(reason, owner):
                break
        else:
            raise HaloError(f"{self.path}: could not take the job lock (it keeps changing)")
        self._beat = threading.Thread(target=self._heartbeat, name="halo-job-lock", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        owner, _ = _read(self.path)
        if owner == self.me:
            self.path.unlink(missing_ok=True)


def owned(job_dir: Path) -> bool:
    """Whether this process holds ``job_dir``'s lock."""
    owner, _ = _read(job_dir / LOCK_NAME)
    return owner == Owner.me()


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def held(job_dir: Path, log: Callable[[str], None] = print) -> Iterator[JobLock]:
    lock = JobLock(job_dir, log)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()
