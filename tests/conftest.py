"""Strict tiers: a GPU or rollout test that cannot run here is skipped with its reason."""

from __future__ import annotations

import functools

import pytest
from xdist_groups import (
    pytest_configure_node,
    pytest_unconfigure,
    pytest_xdist_make_scheduler,
    record_groups,
)

# pytest finds hooks by name in this module: the imported ones serve the whole suite.
__all__ = ["pytest_configure_node", "pytest_unconfigure", "pytest_xdist_make_scheduler"]

GPU_MARKERS = ("gpu_core", "gpu_full")


@functools.cache
def _gpu_absent_reason() -> str | None:
    from halo.train.launch.driver import check

    driver = check()
    if not driver.ok:  # one line: "driver X, image needs ≥ 580 (CUDA 13.0)"
        return driver.detail
    try:
        import torch
    except ImportError:
        return "needs a CUDA GPU: torch is not installed here"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU: torch.cuda.is_available() is False on this machine"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    record_groups(config, items)
    for item in items:
        if any(item.get_closest_marker(m) for m in GPU_MARKERS):
            reason = _gpu_absent_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
