"""Rollout tiers talk to a live server; without one every test is skipped, with the reason.

`halo test rollout-vllm|rollout-sglang` checks /health before pytest starts and prints the
compose command that starts the server; these fixtures are for pytest run by hand.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request

import pytest
from rollout_client import Server

SERVERS = {
    "rollout_vllm": ("HALO_VLLM_URL", "http://127.0.0.1:8000", "images/docker-compose.vllm.yml"),
    "rollout_sglang": (
        "HALO_SGLANG_URL",
        "http://127.0.0.1:30000",
        "images/docker-compose.sglang.yml",
    ),
}


def _reachable(url: str) -> str | None:
    """None when /health answers 200, else why not."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=3) as resp:
            return None if resp.status == 200 else f"/health answered HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"/health answered HTTP {exc.code}"
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        return f"nothing answers ({getattr(exc, 'reason', exc)})"


def _server(marker: str) -> Server:
    env, default, compose = SERVERS[marker]
    url = os.environ.get(env, default).rstrip("/")
    why = _reachable(url)
    if why:
        pytest.skip(
            f"needs a live rollout server at {url} (${env}): {why}; "
            f"start one with: docker compose -f {compose} up -d"
        )
    return Server(url)


@pytest.fixture(scope="session")
def vllm_server() -> Server:
    return _server("rollout_vllm")


@pytest.fixture(scope="session")
def sglang_server() -> Server:
    return _server("rollout_sglang")
