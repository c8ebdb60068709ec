"""The install step of every image, and of `halo stack verify`: one code path for both.

Run as ``python INSTALL_DIR VENV WHEELS`` (INSTALL_DIR is staged next to the wheels by
``halo.stack.stage``; the Dockerfiles run it from their build context, the stack check from
scratch). It

1. makes a fresh venv with the interpreter that runs it (the image's, or the set's CPython),
2. installs the lock's wheels with the lock's own pip, offline and hash-checked
   (``PIP_FLAGS``), with every pip configuration of the host switched off,
3. applies the metadata patches staged with it (patches that edit ``*.dist-info`` files,
   so that ``pip check`` sees the stack as the lock means it), strictly,
4. runs ``pip check`` and removes bytecode caches,
5. assembles ``VENV/cuda`` when the lock brings nvcc (halo.stack.cuda_home): the CUDA_HOME
   that DeepEP's JIT and the derivation builds compile with.

Only the standard library is imported before the venv exists; step 3 runs again under the
venv's interpreter, where the lock's ``packaging`` is installed for the patch engine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

# The pip flags of the install: no index, no resolution, every file checked against the
# lock's sha256, no bytecode (it is not reproducible). --ignore-installed because pip runs
# from its own wheel, which makes it look installed already in the fresh venv.
PIP_FLAGS = (
    "--no-index",
    "--no-deps",
    "--ignore-installed",
    "--require-hashes",
    "--no-compile",
)
PIP_WHEEL = "_pip.whl"
REQUIREMENTS = "requirements.txt"
PATCHES = "patches"


def clean_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment pip runs in: no PIP_* or PYTHON* settings of the host, no config files.

    A host's pip.conf may add wheel folders, indexes or constraints (this is what makes an
    install pass on one machine and fail on another); PIP_CONFIG_FILE=/dev/null turns every
    configuration file off.
    """
    kept = {k: v for k, v in env.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    kept.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_NO_CACHE_DIR="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONNOUSERSITE="1",
    )
    return kept


def say(line: str) -> None:
    print(f"install-step: {line}", flush=True)


def run(argv: Sequence[str], env: Mapping[str, str]) -> None:
    say("$ " + " ".join(str(a) for a in argv))
    proc = subprocess.run([str(a) for a in argv], env=dict(env), check=False)
    if proc.returncode != 0:
        raise SystemExit(f"install-step: error: {Path(argv[0]).name} exited {proc.returncode}")


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def install(here: Path, venv: Path, wheels: Path) -> None:
    env = clean_env(os.environ)
    for need in (wheels / PIP_WHEEL, wheels / REQUIREMENTS):
        if not need.exists():
            raise SystemExit(f"install-step: error: {need}: missing from the staged wheels")
    if venv.exists() and any(venv.iterdir()):
        raise SystemExit(f"install-step: error: {venv}: exists and is not empty")
    python = venv_python(venv)
    run([sys.executable, "-m", "venv", "--without-pip", venv], env)
    pip = wheels / PIP_WHEEL / "pip"
    run(
        [python, pip, "install", *PIP_FLAGS, "--find-links", wheels, "-r", wheels / REQUIREMENTS],
        env,
    )
    run([python, here, "patch", here / PATCHES], env)
    run([python, "-m", "pip", "check"], env)
    from halo.stack.cuda_home import assemble

    if (home := assemble(venv)) is not None:
        say(f"CUDA_HOME: {home} (the lock's nvcc and headers)")
    for cache in sorted(venv.rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache, ignore_errors=True)
    say(f"done: {venv}")


def patch(patches: Path) -> None:
    """Apply the staged patches to this interpreter's site-packages, strictly."""
    try:
        import packaging  # noqa: F401 - the patch engine compares versions with it
    except ImportError:
        raise SystemExit(
            "install-step: error: the stack has no `packaging`, which the patch engine needs; "
            "add it to the set's requirements"
        ) from None
    from halo.errors import HaloError
    from halo.patching.engine import drift_lines, plan_all, write_plans
    from halo.patching.loader import load_patches
    from halo.patching.site import default_site

    site = default_site()
    try:
        plans = plan_all(load_patches(patches) if patches.is_dir() else [], site)
    except HaloError as exc:
        raise SystemExit(f"install-step: error: {exc.message}") from None
    results = [p.result for p in plans]
    for r in results:
        say(f"patch {r.name}: {r.state}: {r.detail}")
    if drift := drift_lines(results):
        for line in drift:
            print(f"install-step: drift: {line}", file=sys.stderr)
        raise SystemExit(1)
    write_plans(plans)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    here = Path(__file__).resolve().parents[2]  # INSTALL_DIR: it holds halo/stack/this file
    if len(args) == 2 and args[0] == "patch":
        patch(Path(args[1]))
        return 0
    if len(args) == 2:
        install(here, Path(args[0]), Path(args[1]))
        return 0
    print("usage: python INSTALL_DIR VENV WHEELS", file=sys.stderr)
    return 2
