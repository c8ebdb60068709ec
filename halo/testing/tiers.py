"""Test tiers: which marker, which folder, what the container needs, and how results read."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from halo.errors import HaloError
from halo.junit import Counts, read_counts
from halo.report import table
from halo.rollout import native
from halo.rollout.native import Running
from halo.rollout.servers import ServerKind, identify
from halo.testing.container import SCRATCH, RunSpec, run_spec
from halo.testing.tier_table import TIERS, Tier, tier

__all__ = ["TIERS", "Tier", "tier"]  # the table lives below the catalog (halo.testing.tier_table)

NO_TESTS_COLLECTED = 5


def check_server(t: Tier) -> None:
    """Rollout tiers need a live server; say exactly how to start one when it isn't there."""
    kind = t.server_kind
    if kind and (why := kind.not_running()):
        raise HaloError(f"{t.name}: {why}")


def pytest_argv(t: Tier, junit: str, extra: list[str]) -> list[str]:
    workers = ["-n", str(min(4, os.cpu_count() or 1))] if t.parallel else []
    argv = ["-m", "pytest", t.path, "-m", t.marker, "-p", "no:cacheprovider", f"--junitxml={junit}"]
    return [*argv, *workers, *extra]


def read_junit(path: Path) -> Counts | None:
    """A tier's totals (halo.junit reads every report the same way)."""
    return read_counts(path)


def _torch_here() -> str:
    """Which torch a native run tests (a CPU build, or a GPU stack's torch on the CPU)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"torch=={version('torch')}"
    except PackageNotFoundError:
        return "no-torch"


@dataclass(frozen=True)
class Placement:
    """Where a tier's container runs beyond its defaults: GPUs, which ones, which fabric."""

    gpus: bool = False
    fabric: str = "none"
    cuda_devices: str = "all"
    # dense or moe: which rollout-server configuration the tests target (HALO_SERVER_TIER).
    server_tier: str = ""
    read_only: bool = False  # docker run --read-only, writes only to scratch and /tmp
    user: str | None = None  # docker run --user UID:GID

    def flags(self) -> tuple[str, ...]:
        """The placement as `halo test` flags, defaults left out (what an attestation records)."""
        out = ["--gpus"] if self.gpus else []
        if self.fabric != "none":
            out.append(f"--fabric={self.fabric}")
        if self.cuda_devices != "all":
            out.append(f"--cuda-devices={self.cuda_devices}")
        if self.server_tier:
            out.append(f"--server-tier={self.server_tier}")
        if self.read_only:
            out.append("--read-only")
        if self.user is not None:
            out.append(f"--user={self.user}")
        return tuple(out)


def junit_path(t: Tier, scratch: Path) -> Path:
    """Where a run of ``t`` leaves pytest's junit XML on the host."""
    return scratch / "reports" / f"{t.name}.xml"


def run_tier(
    t: Tier,
    image_ref: str | None,
    scratch: Path,
    extra: list[str],
    serve: bool = False,
    model: Path | None = None,
    place: Placement | None = None,
) -> int:
    """Run a tier in ``image_ref`` (or natively when None); print pytest's output and a summary.

    A rollout tier with ``serve`` starts the CPU server itself when none answers (its log under
    scratch) and stops it afterwards; without ``serve`` a missing server is one line that says
    how to start it.
    """
    kind = t.server_kind
    started = None
    if kind and serve and kind.not_running():
        from halo.paths import find_repo

        started = native.start(kind, find_repo(), scratch, model=model)
    try:
        check_server(t)
        rc = _run_pytest(t, image_ref, scratch, extra, kind, started, place or Placement())
    finally:
        if started is not None:
            native.stop(started)
    return rc


def _owned_by(user: str, scratch: Path, since_ns: int, tier_name: str) -> None:
    """Under `--user`, everything the tier wrote belongs to that user (one line if not)."""
    from halo.testing.container import USER_DIRS
    from halo.testing.ownership import foreign_writes, parse_user

    uid, gid = parse_user(user)
    found = [p for sub in USER_DIRS for p in foreign_writes(scratch / sub, since_ns, uid, gid)]
    if found:
        st = found[0].lstat()
        raise HaloError(
            f"tier {tier_name}: {len(found)} paths written under scratch are not {user}'s, "
            f"e.g. {found[0]} ({st.st_uid}:{st.st_gid})"
        )
    print(f"tier {tier_name}: everything it wrote under scratch is {user}'s")


def _keep_report(junit: Path) -> None:
    """A copy of the tier's junit XML under $HALO_TEST_REPORTS (CI's runner sets it per session:
    its table counts the tests a session ran inside images)."""
    import shutil

    folder = os.environ.get("HALO_TEST_REPORTS")
    if folder and junit.is_file():
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(junit, Path(folder) / junit.name)


def in_container(path: Path, scratch: Path) -> str:
    """``path`` under scratch as a tier's container sees it (scratch is mounted at /scratch)."""
    try:
        return f"{SCRATCH}/{path.resolve().relative_to(scratch.resolve())}"
    except ValueError:
        return str(path)  # not under scratch: not visible in the container


def _served_here(kind: ServerKind, scratch: Path) -> Running | None:
    """The server `halo serve` started earlier, when it is the one answering the tier."""
    run = Running.load(scratch, kind.name)
    return run if run and run.url == kind.url and run.alive() else None


def _run_pytest(
    t: Tier,
    image_ref: str | None,
    scratch: Path,
    extra: list[str],
    kind: ServerKind | None,
    started: Running | None,
    place: Placement,
) -> int:
    junit_host = junit_path(t, scratch)
    junit_host.parent.mkdir(parents=True, exist_ok=True)
    junit_host.unlink(missing_ok=True)
    env = {kind.url_env: kind.url} if kind else {}
    served = started or (_served_here(kind, scratch) if kind else None)
    if served is not None:
        # The served folder, as the tests see it: the weight-push tests copy and reload it.
        env["HALO_MODEL"] = served.model
        env["HALO_SERVED_FOLDER_ON_SERVER"] = served.model
        env["HALO_SERVED_MODEL_NAME"] = Path(served.model).name
        if image_ref is not None:
            env["HALO_MODEL"] = in_container(Path(served.model), scratch)
    if started is not None:
        # The tier owns this server and stops it afterwards: its tests may kill it (the last
        # of them does: a server killed mid-run of online GRPO).
        env["HALO_SERVER_PID"] = str(started.pid)
    if kind and image_ref is not None:
        # A container sees scratch at /scratch; a server on the host sees it where it is.
        env["HALO_SERVER_SCRATCH"] = str(scratch)
    if place.server_tier:
        env["HALO_SERVER_TIER"] = place.server_tier
    # Asked before the tests run: the last of them may have killed the server.
    who = identify(kind) if kind and not kind.not_running() else None
    if image_ref is None:
        rc = subprocess.run(
            [sys.executable, *pytest_argv(t, str(junit_host), extra)],
            env={**os.environ, **env},
            check=False,
        ).returncode
        where = f"native:{_torch_here()}"
    else:
        spec = RunSpec(
            image=image_ref,
            argv=["python", *pytest_argv(t, f"{SCRATCH}/reports/{t.name}.xml", extra)],
            gpus=t.gpus or place.gpus,
            network="host" if kind else "none",
            env=env,
            fabric=place.fabric,
            cuda_devices=place.cuda_devices,
            host_pids=started is not None,
            read_only=place.read_only,
            user=place.user,
        )
        since = time.time_ns()
        rc = run_spec(spec)
        where = image_ref
        if place.user is not None and rc == 0:
            _owned_by(place.user, scratch, since, t.name)
    if kind and who is not None:
        ready = started.ready_s if started else None
        print(
            table(
                ("server", "url", "version", "device", "model", "started by", "start"),
                [
                    (
                        kind.name,
                        kind.url,
                        who.version,
                        who.device,
                        who.model,
                        "this tier" if started else "already running",
                        f"{ready:.0f}s" if ready else "-",
                    )
                ],
            )
        )
    counts = read_junit(junit_host)
    _keep_report(junit_host)
    if counts:
        print(
            table(
                ("tier", "where", "passed", "failed", "errors", "skipped", "time"),
                [
                    (
                        t.name,
                        where,
                        counts.passed,
                        counts.failures,
                        counts.errors,
                        counts.skipped,
                        f"{counts.seconds:.1f}s",
                    )
                ],
            )
        )
    if rc == NO_TESTS_COLLECTED:
        raise HaloError(
            f"tier {t.name}: collected no tests (marker {t.marker} under {t.path}); a tier asked for must run something"
        )
    return rc
