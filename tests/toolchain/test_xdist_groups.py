"""The suite's `--dist loadgroup`: tests of one xdist_group run on one worker, one after another.

The groups guard shared things (one image compressed once, a module's minutes-long fixture made
once); under pytest 9.2 xdist alone spreads them silently (tests/xdist_groups.py says why).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from support import REPO

GROUPED = """import os, time, pytest

@pytest.mark.xdist_group("shared")
@pytest.mark.parametrize("n", range(4))
def test_grouped_{m}(n):
    with open(os.environ["RUNS"], "a") as f:
        f.write(f"{{os.environ['PYTEST_XDIST_WORKER']}} {{time.monotonic()}} start\\n")
    time.sleep(0.2)
    with open(os.environ["RUNS"], "a") as f:
        f.write(f"{{os.environ['PYTEST_XDIST_WORKER']}} {{time.monotonic()}} end\\n")

@pytest.mark.parametrize("n", range(4))
def test_free_{m}(n):
    time.sleep(0.1)
"""


def _outer_env() -> dict[str, str]:
    """This run's environment without the variables xdist set for the worker running us."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


def test_a_group_runs_on_one_worker_one_test_after_another(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    for name in ("conftest.py", "xdist_groups.py"):
        shutil.copy(REPO / "tests" / name, tests / name)
    for m in ("a", "b"):
        (tests / f"test_{m}.py").write_text(GROUPED.format(m=m))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers = xdist_group(name): one worker\n")
    runs = tmp_path / "runs.txt"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2",
         "--dist", "loadgroup", "tests"],
        cwd=tmp_path, env={**_outer_env(), "RUNS": str(runs)}, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "16 passed" in proc.stdout, proc.stdout[-2000:]
    events = [line.split() for line in runs.read_text().splitlines()]
    assert len(events) == 16  # 8 grouped tests, a start and an end each
    assert len({worker for worker, _, _ in events}) == 1, events
    order = [kind for _, _, kind in sorted(events, key=lambda e: float(e[1]))]
    assert order == ["start", "end"] * 8, "one after another, never two at once"
