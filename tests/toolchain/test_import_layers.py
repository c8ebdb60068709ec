"""halo/'s import graph: no cycles, and the layering of pyproject.toml's [tool.importlinter].

The graph is grimp's (what `lint-imports` checks), which counts imports inside functions too:
a lazy import is still a dependency. Each check is also run on a copy of halo/ broken on
purpose, so that neither can pass by checking nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

pytest.importorskip("grimp", reason="needs the toolchain's grimp (pins/toolchain.txt)")
LINT_IMPORTS = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))

# Strongly connected components of the package's graph, as one line each (Tarjan, iterative).
CYCLES = """
import sys, grimp
g = grimp.build_graph("halo")
index, low, on, stack, found, n = {}, {}, set(), [], [], 0
for root in sorted(g.modules):
    if root in index:
        continue
    work = [(root, iter(sorted(g.find_modules_directly_imported_by(root))))]
    index[root] = low[root] = n; n += 1; stack.append(root); on.add(root)
    while work:
        v, it = work[-1]
        w = next(it, None)
        if w is not None:
            if w not in index:
                index[w] = low[w] = n; n += 1; stack.append(w); on.add(w)
                work.append((w, iter(sorted(g.find_modules_directly_imported_by(w)))))
            elif w in on:
                low[v] = min(low[v], index[w])
            continue
        work.pop()
        if work:
            low[work[-1][0]] = min(low[work[-1][0]], low[v])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(" <-> ".join(sorted(comp)))
print("\\n".join(found))
sys.exit(1 if found else 0)
"""


def _copy(tmp_path: Path) -> Path:
    """halo/ and the contracts, to break; nothing else is needed to lint them."""
    dest = tmp_path / "repo"
    shutil.copytree(REPO / "halo", dest / "halo", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copyfile(REPO / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _run(argv: list[str], root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}  # this halo/, not the installed one
    return subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, check=False)


def _append(path: Path, code: str) -> None:
    path.write_text(path.read_text() + "\n\n" + code + "\n")


def test_halo_has_no_import_cycles_and_keeps_its_contracts() -> None:
    cycles = _run([sys.executable, "-c", CYCLES], REPO)
    assert cycles.returncode == 0, cycles.stdout + cycles.stderr
    lint = _run([LINT_IMPORTS, "--no-cache"], REPO)
    assert lint.returncode == 0, lint.stdout[-3000:] + lint.stderr


def test_a_lazy_import_that_closes_a_cycle_is_found(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    # halo.paths is below halo.pins.names' users; a function-level import back up closes a loop.
    _append(
        root / "halo" / "pins" / "names.py",
        "def _up():\n    from halo.paths import find_repo\n\n    return find_repo",
    )
    proc = _run([sys.executable, "-c", CYCLES], root)
    assert proc.returncode == 1
    assert proc.stdout.strip() == "halo.paths <-> halo.pins.names"


def test_the_trainer_importing_the_toolchain_breaks_lint(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _append(
        root / "halo" / "train" / "loop" / "loop.py",
        "def _docker():\n    import halo.images.docker",
    )
    proc = _run([LINT_IMPORTS, "--no-cache"], root)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "the trainer does not depend on the image toolchain BROKEN" in proc.stdout
    assert "halo.train.loop.loop -> halo.images.docker" in proc.stdout


@pytest.mark.parametrize(
    ("module", "imported", "contract"),
    [
        (
            "methods/sft.py",
            "halo.train.launch.slurm",
            "the trainer's parts never import launching (only halo.train.cli and .run do)",
        ),
        ("loop/loop.py", "halo.train.methods.sft", "the loop and what it stands on know no method"),
        (
            "models/moe.py",
            "halo.train.loop.setup",
            "models, parallelism, data and checkpoints never import the loop",
        ),
        ("launch/slurm.py", "torch", "launching needs no torch"),
    ],
)
def test_the_trainers_folders_keep_their_order(
    tmp_path: Path, module: str, imported: str, contract: str
) -> None:
    root = _copy(tmp_path)
    _append(root / "halo" / "train" / module, f"def _up():\n    import {imported}")
    proc = _run([LINT_IMPORTS, "--no-cache"], root)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert f"{contract} BROKEN" in proc.stdout
    source = "halo.train." + module.removesuffix(".py").replace("/", ".")
    assert f"{source} -> {imported}" in proc.stdout
