"""`halo stack install SET PREFIX`: a set's locked stack as a venv on a host without Docker.

The same steps as the training images, in the same order: the install step
(halo/stack/install_step.py: a fresh venv with the set's CPython, the lock's wheels offline and
hash-checked, metadata patches, pip check), the kernels layer (the set's source derivations from
the store), then halo's own wheel built from this checkout. A cluster's login node gets the
stack the images carry, and `PREFIX/bin/halo launch ...` trains from it.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from halo.errors import HaloError
from halo.stack.verify import FAIL, Inputs, install, install_kernels


def install_prefix(inputs: Inputs, fresh: bool) -> list[str]:
    """Install into ``inputs.venv``; returns one line per step done (raises on failure)."""
    from halo.images.wheel import build_wheel

    done: list[str] = []
    row = install(inputs, fresh)
    if row.result == FAIL:
        raise HaloError(f"halo stack install: {inputs.spec.set}: {row.detail}: {row.failures}")
    done.append(f"stack: {row.detail}")
    kernels_row, _ = install_kernels(inputs)
    if kernels_row.result == FAIL:
        raise HaloError(f"halo stack install: {inputs.spec.set}: kernels: {kernels_row.failures}")
    done.append(f"kernels: {kernels_row.detail}")
    with tempfile.TemporaryDirectory(prefix="halo-wheel-") as tmp:
        wheel = build_wheel(inputs.repo, Path(tmp))
        # As the images' step 3: no index, no dependencies (the lock brought them).
        pip = [str(inputs.venv / "bin" / "python"), "-m", "pip", "install", "--no-index"]
        pip += ["--no-deps", "--no-compile", "--force-reinstall", str(wheel)]
        proc = subprocess.run(pip, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
            raise HaloError(f"halo stack install: halo's wheel: pip: {tail[0]}")
        done.append(f"halo: {wheel.name}")
    return done
