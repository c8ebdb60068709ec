"""Rollout tiers talk to a live server; without one every test is skipped, with the reason.

`halo test rollout-vllm|rollout-sglang` checks /health before pytest starts (and, with
--serve, starts a CPU server itself); these fixtures cover pytest run by hand. The server
table and the probe are halo.rollout.servers, shared with the tiers.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rollout_client import Server

from halo.rollout.servers import server


def _server(name: str) -> Server:
    kind = server(name)
    if why := kind.not_running():
        pytest.skip(f"{why}; {kind.no_cpu_reason}" if kind.no_cpu_reason else why)
    return Server(kind.url)


@pytest.fixture(scope="session")
def vllm_server() -> Server:
    return _server("vllm")


@pytest.fixture(scope="session")
def sglang_server() -> Server:
    return _server("sglang")


@pytest.fixture(scope="session")
def served_folder() -> Path:
    """The served model's folder as this process sees it (the tier sets HALO_MODEL)."""
    model = Path(os.environ.get("HALO_MODEL", ""))
    if not (model / "config.json").is_file():
        pytest.skip(
            f"needs the served model's folder here (HALO_MODEL={model}): the tier sets it "
            "when it starts the server or finds one `halo serve` started"
        )
    return model
