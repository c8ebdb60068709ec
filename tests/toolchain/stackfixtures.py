"""Small real stacks for `halo stack verify`: wheels with gcc-built shared objects, a store,
a lock, and the real pip (CPython's bundled wheel) to install them with.

Nothing here imitates the checker: the install step, pip, the ELF reader and the probe all
run for real on these files; only the stack is tiny.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from halo.hashing import sha256_file
from halo.pins.lockfile import Artifact, Lock, Package
from halo.store.store import Store

PY = f"{sys.version_info.major}.{sys.version_info.minor}"


def gcc() -> str:
    found = shutil.which("gcc")
    if not found:
        pytest.skip("needs gcc to build the ELF fixtures (.ci/run installs it)")
    return found


def shared_object(out: Path, source: str, *link: str, soname: str | None = None) -> Path:
    """Compile ``source`` (C) into a shared object at ``out``; ``link`` are extra gcc args."""
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_suffix(".c")
    src.write_text(source)
    args = [gcc(), "-shared", "-fPIC", "-o", str(out), str(src)]
    if soname:
        args.append(f"-Wl,-soname,{soname}")
    subprocess.run([*args, *link], check=True, capture_output=True)
    src.unlink()
    return out


def bundled_pip() -> Path:
    """The pip wheel CPython ships for ensurepip: a real pip, no network."""
    import ensurepip

    found = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))
    if not found:
        pytest.skip("this CPython has no bundled pip wheel (ensurepip)")
    return found[-1]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel(
    out_dir: Path,
    name: str,
    version: str,
    files: dict[str, bytes],
    requires: tuple[str, ...] = (),
) -> Path:
    """A valid py3-none-any wheel holding ``files`` (archive path -> bytes)."""
    stem = name.replace("-", "_")
    dist_info = f"{stem}-{version}.dist-info"
    meta = "".join(
        [
            "Metadata-Version: 2.1\n",
            f"Name: {name}\n",
            f"Version: {version}\n",
            *(f"Requires-Dist: {r}\n" for r in requires),
        ]
    )
    members = {
        **files,
        f"{dist_info}/METADATA": meta.encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: halo-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in members.items())
    members[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    out = out_dir / f"{stem}-{version}-py3-none-any.whl"
    out_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w") as zf:
        for member, data in members.items():
            info = zipfile.ZipInfo(member, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if member.endswith(".so") else 0o644) << 16
            zf.writestr(info, data)
    return out


@dataclass
class TinyStack:
    """Wheels in a store and the lock that names them, like a real pin set."""

    root: Path
    wheels: list[tuple[str, str, Path]] = field(default_factory=list)

    @property
    def store(self) -> Store:
        return Store(self.root / "store")

    def add(self, name: str, version: str, files: dict[str, bytes], requires=()) -> None:
        path = wheel(self.root / "dist", name, version, files, tuple(requires))
        self.wheels.append((name, version, path))

    def lock(self, set_name: str = "tiny") -> Lock:
        """Every real set holds pip (the install runs it) and packaging (the patch engine's)."""
        version, packaging = installed_wheel(self.root / "dist", "packaging")
        base = [("pip", _pip_version(), bundled_pip()), ("packaging", version, packaging)]
        packages = []
        for name, version, path in [*base, *self.wheels]:
            sha = sha256_file(path)
            self.store.add_file(sha, path, path.name)
            packages.append(
                Package(name, version, (Artifact(path.name, sha, path.stat().st_size),))
            )
        return Lock(
            set=set_name,
            python=PY,
            platform="x86_64-manylinux_2_36",
            inputs_sha256="0" * 64,
            packages=tuple(packages),
            extra={"requirements": [p.name for p in packages], "excluded": []},
        )


def installed_wheel(out_dir: Path, name: str) -> tuple[str, Path]:
    """(version, wheel) of a distribution installed here, zipped back from its RECORD."""
    from importlib.metadata import distribution

    dist = distribution(name)
    files = {}
    for f in dist.files or ():
        path = Path(str(dist.locate_file(f)))
        if ".dist-info" not in str(f) and "__pycache__" not in str(f) and path.is_file():
            files[str(f)] = path.read_bytes()
    return dist.version, wheel(out_dir, name, dist.version, files)


def _pip_version() -> str:
    return bundled_pip().name.split("-")[1]


def fake_torch(nccl: tuple[int, int, int], cuda: str = "13.0") -> dict[str, bytes]:
    """A stand-in torch package: only what the probe reads (version, CUDA build, NCCL)."""
    return {
        "torch/__init__.py": b'__version__ = "2.11.0+cu130"\nfrom . import cuda, version\n',
        "torch/version.py": f'cuda = "{cuda}"\n'.encode(),
        "torch/cuda/__init__.py": b"from . import nccl\n",
        "torch/cuda/nccl.py": f"def version():\n    return {nccl!r}\n".encode(),
    }
