"""Fixtures for toolchain tests: a throwaway copy of the checkout, a real local package index."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import COPY_IGNORE, REPO, LocalIndex


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """A copy of the checkout to break things in; the real one is never touched."""
    dest = tmp_path / "repo"
    shutil.copytree(REPO, dest, ignore=COPY_IGNORE)
    return dest


@pytest.fixture
def isolated_env(tmp_path: Path) -> dict[str, str]:
    """Store and caches in empty temp folders, so a test can prove nothing was written."""
    return {"HALO_STORE": str(tmp_path / "store"), "XDG_CACHE_HOME": str(tmp_path / "cache")}


@pytest.fixture
def local_index(tmp_path: Path) -> Iterator[LocalIndex]:
    index = LocalIndex(tmp_path / "index")
    index.thread.start()
    yield index
    index.server.shutdown()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that drive a Docker engine first (builds, stages, exports: minutes each), then
    the rest (a second or less each): under pytest-xdist each worker starts on a long one and
    the short ones fill the gaps, instead of two long ones left for the end. A stable sort:
    every worker collects the same order, as xdist requires."""
    items.sort(key=lambda item: item.get_closest_marker("docker") is None)
