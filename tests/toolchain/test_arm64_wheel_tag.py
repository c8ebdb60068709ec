"""The cusparselt-wheel-tag patch against the real wheels of nvidia-cusparselt-cu13 0.8.0.

The aarch64 wheel's WHEEL says `Tag: py3-none-manylinux2014_sbsa`; once installed for
linux/arm64, `uv pip check --python-platform aarch64-manylinux_2_36` refuses it. The patch
states aarch64 (applied, then already-applied) and leaves the x86_64 wheel, whose Tag is
standard, alone (fixed-upstream). Both wheels come from the store (`halo fetch cpu-arm64`,
`halo fetch cpu`).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from support import REPO

from halo.patching.engine import plan_patch, write_plans
from halo.patching.loader import load_patches
from halo.patching.model import State
from halo.paths import store_root
from halo.pins.lockfile import load_lock
from halo.stack.stage import is_metadata_patch
from halo.store.store import Store

DIST = "nvidia_cusparselt_cu13-0.8.0.dist-info"


def _site(tmp: Path, set_name: str) -> Path:
    """The wheel's dist-info, as an install leaves it, in a site folder of its own."""
    lock = load_lock(REPO / "pins" / f"pylock.{set_name}.toml")
    pkg = lock.package("nvidia-cusparselt-cu13")
    assert pkg is not None and pkg.version == "0.8.0"
    wheel = Store(store_root()).path(pkg.artifacts[0].sha256)
    if not wheel.is_file():
        pytest.skip(f"needs the locked wheel in the store (`halo fetch {set_name}`)")
    site = tmp / set_name
    with zipfile.ZipFile(wheel) as zf:
        for name in (f"{DIST}/WHEEL", f"{DIST}/METADATA", f"{DIST}/RECORD"):
            (site / name).parent.mkdir(parents=True, exist_ok=True)
            (site / name).write_bytes(zf.read(name))
    return site


def _patch():  # type: ignore[no-untyped-def]
    (patch,) = [p for p in load_patches(REPO / "patches") if p.name == "cusparselt-wheel-tag"]
    return patch


# In test-arm64, which fetches cpu-arm64 first (the toolchain session ran before that fetch and
# skipped it for want of the wheel).
@pytest.mark.arm64
def test_the_aarch64_wheel_gets_its_file_names_tag(tmp_path: Path) -> None:
    site = _site(tmp_path, "cpu-arm64")
    assert "Tag: py3-none-manylinux2014_sbsa\n" in (site / DIST / "WHEEL").read_text()
    patch = _patch()
    assert is_metadata_patch(patch)  # applied by the install step, before the check
    first = plan_patch(patch, site)
    assert first.result.state is State.APPLIED, first.result.detail
    write_plans([first])
    text = (site / DIST / "WHEEL").read_text()
    assert "Tag: py3-none-manylinux_2_17_aarch64\n" in text and "sbsa" not in text
    assert plan_patch(patch, site).result.state is State.ALREADY_APPLIED


def test_the_x86_64_wheel_is_left_alone(tmp_path: Path) -> None:
    site = _site(tmp_path, "cpu")
    before = (site / DIST / "WHEEL").read_bytes()
    result = plan_patch(_patch(), site)
    assert result.result.state is State.FIXED_UPSTREAM, result.result.detail
    assert not result.writes and (site / DIST / "WHEEL").read_bytes() == before
