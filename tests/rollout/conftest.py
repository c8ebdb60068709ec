"""Rollout tiers talk to a live server; without one every test is skipped, with the reason.

`halo test rollout-vllm|rollout-sglang` checks /health before pytest starts (and, with
--serve, starts a CPU server itself); these fixtures cover pytest run by hand. The server
table and the probe are halo.rollout.servers, shared with the tiers.
"""

from __future__ import annotations

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
