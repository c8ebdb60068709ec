"""Test tiers: which marker, which folder, what the container needs, and how results read."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from halo.errors import HaloError
from halo.report import table
from halo.testing.container import SCRATCH, RunSpec, run_spec

NO_TESTS_COLLECTED = 5


@dataclass(frozen=True)
class Tier:
    name: str
    marker: str
    path: str
    gpus: bool = False
    parallel: bool = False  # pytest-xdist workers; GPU and server tiers share one device, so no
    server_env: str = ""
    server_default: str = ""
    compose: str = ""


TIERS = {
    t.name: t
    for t in (
        Tier("cpu", "cpu", "tests/cpu", parallel=True),
        Tier("gpu-core", "gpu_core", "tests/gpu_core", gpus=True),
        Tier("gpu-full", "gpu_full", "tests/gpu_full", gpus=True),
        Tier(
            "rollout-vllm",
            "rollout_vllm",
            "tests/rollout",
            server_env="HALO_VLLM_URL",
            server_default="http://127.0.0.1:8000",
            compose="images/docker-compose.vllm.yml",
        ),
        Tier(
            "rollout-sglang",
            "rollout_sglang",
            "tests/rollout",
            server_env="HALO_SGLANG_URL",
            server_default="http://127.0.0.1:30000",
            compose="images/docker-compose.sglang.yml",
        ),
    )
}


def tier(name: str) -> Tier:
    key = name.replace("_", "-")
    if key not in TIERS:
        raise HaloError(f"unknown test tier '{name}' (known: {', '.join(TIERS)})")
    return TIERS[key]


def server_url(t: Tier) -> str:
    return os.environ.get(t.server_env, t.server_default).rstrip("/")


def check_server(t: Tier) -> None:
    """Rollout tiers need a live server; say exactly how to start one when it isn't there."""
    if not t.server_env:
        return
    url = f"{server_url(t)}/health"
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            if resp.status == 200:
                return
    except (urllib.error.URLError, TimeoutError, OSError):
        pass
    raise HaloError(
        f"{t.name}: no rollout server answers {url}; start it with: "
        f"docker compose -f {t.compose} up -d  (or set {t.server_env})"
    )


def pytest_argv(t: Tier, junit: str, extra: list[str]) -> list[str]:
    workers = ["-n", str(min(4, os.cpu_count() or 1))] if t.parallel else []
    argv = ["-m", "pytest", t.path, "-m", t.marker, "-p", "no:cacheprovider", f"--junitxml={junit}"]
    return [*argv, *workers, *extra]


@dataclass(frozen=True)
class Counts:
    tests: int
    failures: int
    errors: int
    skipped: int
    seconds: float

    @property
    def passed(self) -> int:
        return self.tests - self.failures - self.errors - self.skipped


def read_junit(path: Path) -> Counts | None:
    if not path.is_file():
        return None
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return None
    a = suite.attrib
    return Counts(
        int(a.get("tests", 0)),
        int(a.get("failures", 0)),
        int(a.get("errors", 0)),
        int(a.get("skipped", 0)),
        float(a.get("time", 0.0)),
    )


def _torch_here() -> str:
    """Which torch a native run tests (a CPU build, or a GPU stack's torch on the CPU)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"torch=={version('torch')}"
    except PackageNotFoundError:
        return "no-torch"


def run_tier(t: Tier, image_ref: str | None, scratch: Path, extra: list[str]) -> int:
    """Run a tier in ``image_ref`` (or natively when None); print pytest's output and a summary."""
    check_server(t)
    reports = scratch / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    junit_host = reports / f"{t.name}.xml"
    junit_host.unlink(missing_ok=True)
    if image_ref is None:
        rc = subprocess.run(
            [sys.executable, *pytest_argv(t, str(junit_host), extra)], check=False
        ).returncode
        where = f"native:{_torch_here()}"
    else:
        env = {t.server_env: server_url(t)} if t.server_env else {}
        spec = RunSpec(
            image=image_ref,
            argv=["python", *pytest_argv(t, f"{SCRATCH}/reports/{t.name}.xml", extra)],
            gpus=t.gpus,
            network="host" if t.server_env else "none",
            env=env,
        )
        rc = run_spec(spec)
        where = image_ref
    counts = read_junit(junit_host)
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
