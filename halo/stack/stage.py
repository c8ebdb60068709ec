"""Stage what the install step needs: the lock's wheels and the install step itself.

The same two folders go into an image's build context (``wheels/``, ``install/``) and into
the scratch folder of `halo stack verify`, and both run them with the same command
(``install_argv``): the image build and the stack check cannot install differently.

wheels/   the lock's artifacts, hard-linked from the store after re-verifying their sha256,
          requirements.txt (name==version --hash=...) and _pip.whl to install them with
install/  ``python install/ VENV WHEELS``: halo.stack.install_step, the patch engine it
          runs, and the metadata patches (those that edit only ``*.dist-info`` files)
"""

from __future__ import annotations

import shutil
from pathlib import Path

from halo.confine import inside
from halo.errors import HaloError
from halo.patching.loader import load_patches
from halo.patching.model import Patch
from halo.pins.lockfile import Lock, lock_name, normalize
from halo.stack import install_step
from halo.store.store import Store

PIP_NAME = "pip"
# What `python install/` imports: the standard library, these modules and, once the venv
# exists, the lock's own `packaging`. Anything else would break the image build.
INSTALL_MODULES = (
    "errors.py",
    "atomic.py",
    "patching/__init__.py",
    "patching/model.py",
    "patching/engine.py",
    "patching/site.py",
    "patching/loader.py",
    "stack/__init__.py",
    "stack/install_step.py",
    "stack/cuda_home.py",
)
PACKAGE_INIT = '"""halo, as much of it as the install step runs (see halo.stack.stage)."""\n'
MAIN = (
    '"""halo\'s install step: python THIS_FOLDER VENV WHEELS (see halo/stack/install_step.py)."""\n'
    "from halo.stack.install_step import main\n\n"
    "raise SystemExit(main())\n"
)


def install_argv(python: str, install_dir: str, venv: str, wheels: str) -> list[str]:
    """The one command that installs a stack; the Dockerfiles' RUN spells exactly this."""
    return [python, install_dir, venv, wheels]


def requirements(lock: Lock) -> str:
    lines = []
    for pkg in sorted(lock.packages, key=lambda p: normalize(p.name)):
        hashes = " ".join(f"--hash=sha256:{a.sha256}" for a in pkg.artifacts)
        lines.append(f"{pkg.name}=={pkg.version} {hashes}")
    return "\n".join(lines) + "\n"


def stage_wheels(dest: Path, lock: Lock, store: Store) -> None:
    """Fill ``dest`` with the verified artifacts, the lock's pip and requirements.txt."""
    pip = lock.package(PIP_NAME)
    if pip is None or not any(a.is_wheel for a in pip.artifacts):
        raise HaloError(
            f"pins/{lock_name(lock.set)}: no pip wheel; the install step installs the lock offline with "
            "pip, add `pip` to the set's requirements"
        )
    where = f"pins/{lock_name(lock.set)}: packages"
    # Every file name first: a lock is not always one we wrote (the reader refuses these too).
    targets = [(art, inside(dest, art.file, where)) for art in lock.artifacts]
    for art, target in targets:
        store.verify(art.sha256, art.file)
        store.link_into(art.sha256, target)
    pip_wheel = next(a for a in pip.artifacts if a.is_wheel)
    store.link_into(pip_wheel.sha256, dest / install_step.PIP_WHEEL)
    (dest / install_step.REQUIREMENTS).write_text(requirements(lock))


def is_metadata_patch(patch: Patch) -> bool:
    """A patch of distribution metadata only: applied before `pip check`, by the install step."""
    return all(".dist-info/" in f for f in patch.files)


def stage_install_step(dest: Path, patches_dir: Path) -> list[Patch]:
    """Fill ``dest`` with the runnable install step; returns the metadata patches it carries."""
    package = Path(__file__).resolve().parents[1]
    for rel in INSTALL_MODULES:
        target = dest / "halo" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(package / rel, target)
    (dest / "halo" / "__init__.py").write_text(PACKAGE_INIT)
    (dest / "__main__.py").write_text(MAIN)
    chosen = [p for p in load_patches(patches_dir) if is_metadata_patch(p)]
    (dest / install_step.PATCHES).mkdir()
    for patch in chosen:
        shutil.copyfile(patches_dir / patch.source, dest / install_step.PATCHES / patch.source)
    return chosen


def stage(ctx: Path, lock: Lock, store: Store, patches_dir: Path) -> tuple[Path, Path]:
    """``ctx/wheels`` and ``ctx/install``; returns both."""
    wheels, install = ctx / "wheels", ctx / "install"
    wheels.mkdir(parents=True)
    install.mkdir(parents=True)
    stage_wheels(wheels, lock, store)
    stage_install_step(install, patches_dir)
    return wheels, install
