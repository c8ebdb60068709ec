"""device-check without a GPU: the pinned bundle's requirements, the 64 MiB and command limits,
and the runner's junit-to-table page (the real bundle is built by `nox -s device-check --
--dry-run`, which CI runs)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support import REPO

from halo.errors import HaloError
from halo.testing import device_runner, devicecheck


def test_every_missing_package_is_pinned_with_hashes_in_the_toolchain_lock() -> None:
    reqs = devicecheck.locked_requirements(
        (REPO / devicecheck.LOCK).read_text(), devicecheck.MISSING
    )
    assert [r.split("==")[0] for r in reqs] == list(devicecheck.MISSING)
    for r in reqs:
        assert "--hash=sha256:" in r and "\\" not in r, r
    # pydantic-core is compiled: its cp312 manylinux wheel's hash must be among them.
    core = reqs[devicecheck.MISSING.index("pydantic-core")]
    assert core.count("--hash=") > 10


def test_a_package_missing_from_the_lock_is_one_clear_error() -> None:
    with pytest.raises(HaloError, match=r"pins/toolchain.txt: no pinned entry for nope"):
        devicecheck.locked_requirements("pydantic==2.0 \\\n    --hash=sha256:00\n", ("nope",))


def test_the_device_command_fits_the_run_tool() -> None:
    command, carry = devicecheck.device_command()
    assert len(command) <= devicecheck.COMMAND_LIMIT and len(carry) <= devicecheck.CARRY_LIMIT
    assert carry == (devicecheck.BUNDLE,) and '--out "$OUT"' in command
    assert command.startswith("set -o pipefail;")


def test_over_64_mib_is_refused() -> None:
    devicecheck.check_size(30 << 20, 30 << 20)
    with pytest.raises(HaloError, match="exceeds the device tool's 64 MiB"):
        devicecheck.check_size(60 << 20, 5 << 20)


def test_the_bundle_folder_is_git_ignored_and_the_tree_is_small() -> None:
    probe = f"{devicecheck.BUNDLE}/wheels/x.whl"
    r = subprocess.run(["git", "check-ignore", "-q", probe], cwd=REPO, check=False)
    assert r.returncode == 0, f"{probe} is not ignored: it would travel twice"
    assert devicecheck.tree_bytes(REPO) < devicecheck.LIMIT // 4


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="t" name="test_a[fa3-packed]" time="1.25"><properties>
<property name="errors" value="out 3.1e-03, dq 5.0e-03"/></properties></testcase>
<testcase classname="t" name="test_b" time="0.5"><failure message="assert 0.2 &lt;= 0.04&#10;more">x</failure></testcase>
<testcase classname="t" name="test_c" time="0.0"><skipped message="fa4 does not run on SM90"/></testcase>
</testsuite></testsuites>"""


def test_the_runner_turns_junit_and_the_bench_into_one_page(tmp_path: Path) -> None:
    (tmp_path / "gpu_core.xml").write_text(JUNIT)
    (tmp_path / "bench.json").write_text(
        '{"gpu": "NVIDIA H200", "attention": "fa3", "params": 1100000000, "tokens_per_step": 16384,'
        ' "points": [{"seq_len": 2048, "batch": 8, "ratio": 0.98,'
        ' "trainer": {"tokens_per_s": 49000, "mfu": 0.36, "step_s": 0.33},'
        ' "plain": {"tokens_per_s": 50000, "mfu": 0.37, "step_s": 0.32}}], "ok": true}'
    )
    page = device_runner.table(tmp_path, "torch 2.11.0", 1, 0, 300)
    assert "1 FAILED, 1 passed, 1 skipped (pytest exit 1)" in page
    assert "| test_a[fa3-packed] | passed | 1.2 | errors: out 3.1e-03, dq 5.0e-03 |" in page
    assert "| test_b | FAILED | 0.5 | assert 0.2 <= 0.04 |" in page
    assert "| test_c | skipped | 0.0 | fa4 does not run on SM90 |" in page
    assert "| 2048 x 8 | 49000 | 36.0% | 50000 | 37.0% | 0.980 |" in page
    assert len(page.splitlines()) < 80  # one page
