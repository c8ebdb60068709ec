"""Helpers for the CPU tier: run `halo` in a subprocess exactly as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def halo_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("HALO_TEST_HOOK_CHECKPOINT_SLEEP", None)
    env.update(extra)
    return env


def halo_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "halo", *args]


def run_halo(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        halo_cmd(*args),
        env=halo_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def outputs(tmp: Path) -> list[str]:
    """Overrides that send a run's checkpoints and logs under ``tmp``."""
    return [f"--runtime.paths.checkpoints={tmp / 'ck'}", f"--runtime.paths.logs={tmp / 'logs'}"]


@pytest.fixture
def sft_config() -> Path:
    return EXAMPLES / "sft" / "config.yaml"


@pytest.fixture
def grpo_config() -> Path:
    return EXAMPLES / "grpo" / "config.yaml"
