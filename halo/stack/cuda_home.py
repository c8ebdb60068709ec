"""A CUDA_HOME made of the index's CUDA 13 wheels, for compilers that expect a toolkit.

The wheels (nvidia-cuda-nvcc, -crt, -nvvm, -cccl, -runtime, the libraries' headers) all
unpack under ``site-packages/nvidia/cu13/{bin,include,lib,nvvm}``, and nvcc finds its own
front end, cicc and CCCL from there (its nvcc.profile is relative to its binary). What a
toolkit has and the wheels lack is the development side of the libraries: ``-lcudart``
needs an unversioned ``libcudart.so``, and ``torch.utils.cpp_extension`` links from
``$CUDA_HOME/lib64``. ``assemble`` makes ``VENV/cuda`` with relative links into the wheels
(so a venv that is copied or moved keeps working) plus those unversioned names.

Run by the install step (images and `halo stack verify`) and by the native builder; only the
standard library is used, since the install step runs before any dependency exists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

HOME_DIR = "cuda"  # VENV/cuda
WHEEL_ROOT = ("nvidia", "cu13")
LINKED = ("bin", "include", "nvvm")
# libfoo.so.13 or libfoo.so.13.0.88 -> libfoo.so
_VERSIONED_SO = re.compile(r"^(lib[^/]+\.so)\.\d+(\.\d+)*$")


def wheel_root(venv: Path) -> Path | None:
    """``site-packages/nvidia/cu13`` of ``venv`` when nvcc is installed there, else None."""
    for site in sorted(venv.glob("lib/python*/site-packages")):
        root = site.joinpath(*WHEEL_ROOT)
        if (root / "bin" / "nvcc").is_file():
            return root
    return None


def _relative(target: Path, link_dir: Path) -> str:
    return os.path.relpath(target, link_dir)


def assemble(venv: Path) -> Path | None:
    """Make ``VENV/cuda`` (replacing an old one); None when the venv has no nvcc."""
    root = wheel_root(venv)
    if root is None:
        return None
    home = venv / HOME_DIR
    staged = venv / f".{HOME_DIR}.new"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    for name in LINKED:
        if (root / name).is_dir():
            (staged / name).symlink_to(_relative(root / name, staged))
    lib = staged / "lib64"
    lib.mkdir()
    names = sorted(p.name for p in (root / "lib").iterdir()) if (root / "lib").is_dir() else []
    for name in names:
        (lib / name).symlink_to(_relative(root / "lib" / name, lib))
    for name in names:
        match = _VERSIONED_SO.match(name)
        if match and not (lib / match.group(1)).exists():
            (lib / match.group(1)).symlink_to(name)  # the development name, as a toolkit has
    (staged / "lib").symlink_to("lib64")
    if home.is_symlink() or home.is_file():
        home.unlink()
    shutil.rmtree(home, ignore_errors=True)
    staged.rename(home)
    return home


def nvcc_release(home: Path) -> str | None:
    """``13.0`` from ``nvcc --version``, or None when nvcc does not run."""
    try:
        out = subprocess.run(
            [str(home / "bin" / "nvcc"), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
    except OSError:
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def problems(home: Path) -> list[str]:
    """What a compiler would miss in ``home`` (one line each); empty when it is complete."""
    needed = {
        "bin/nvcc": "the compiler (nvidia-cuda-nvcc)",
        "nvvm/bin/cicc": "nvcc's front end (nvidia-nvvm)",
        "include/cuda_runtime.h": "the runtime headers (nvidia-cuda-runtime)",
        "include/crt/host_config.h": "nvcc's own headers (nvidia-cuda-crt)",
        "include/cccl/cub/cub.cuh": "CCCL (nvidia-cuda-cccl)",
        "lib64/libcudart.so": "libcudart for -lcudart (nvidia-cuda-runtime)",
    }
    return [
        f"{home}/{rel}: missing, {what}"
        for rel, what in needed.items()
        if not (home / rel).exists()
    ]
