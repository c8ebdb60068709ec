"""halo's own wheel, built by the project's build backend ([build-system] in pyproject.toml).

The image build is offline and addressed by its inputs, so the wheel must be a function of
what the input hash covers: halo's source tree, pyproject.toml and README.md (the backend
writes it into METADATA). Hence:

- `uv build --wheel --no-build-isolation --offline`: the backend is the one installed with the
  toolchain, and it must be exactly the version [build-system].requires pins (pyproject.toml
  is an input, so a new backend is a new input hash);
- SOURCE_DATE_EPOCH fixed (the host's or the caller's would leak into the zip's timestamps);
- the wheel's files under halo/ must be the hashed tree's, no more and no fewer (the backend
  has its own idea of what to include; a difference fails the build instead of shipping
  something the hash did not see).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

from halo.errors import HaloError
from halo.hashing import sha256_file, tree_files
from halo.images.graph import DEFAULT_EPOCH

# What the backend reads besides halo/'s contents (and so what the input hash must cover).
BACKEND_INPUTS = ("pyproject.toml", "README.md")


def backend_inputs(repo: Path) -> dict[str, object]:
    """What halo's wheel depends on besides the contents of halo/ (image input hash parts).

    The backend keeps a file's executable bit, which a content hash of the tree does not see.
    """
    executable = [
        p.relative_to(repo).as_posix()
        for p in tree_files(repo / "halo")
        if p.stat().st_mode & 0o111
    ]
    return {
        **{f"{Path(n).stem.lower()}_sha256": sha256_file(repo / n) for n in BACKEND_INPUTS},
        "halo_executables": executable,
    }


def check_backend(repo: Path) -> None:
    """Every [build-system].requires is installed here at a version it allows."""
    from packaging.requirements import Requirement

    pyproject = repo / "pyproject.toml"
    requires = tomllib.loads(pyproject.read_text())["build-system"]["requires"]
    for line in requires:
        req = Requirement(line)
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            have = None
        if have is None or not req.specifier.contains(have, prereleases=True):
            raise HaloError(
                f"{pyproject}: build-system.requires: '{line}' builds halo's wheel offline, "
                f"found {have or 'none'}; install the toolchain (`nox -s dev`, or "
                f"`pip install '{line}'`)"
            )


def _halo_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return {n for n in zf.namelist() if n.startswith("halo/") and not n.endswith("/")}


def build_wheel(repo: Path, out_dir: Path) -> Path:
    """Build halo's wheel from ``repo`` into ``out_dir``; returns its path."""
    uv = shutil.which("uv")
    if uv is None:
        raise HaloError("'uv' not found on PATH: halo's wheel is built with `uv build`")
    check_backend(repo)
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(DEFAULT_EPOCH), "UV_NO_PROGRESS": "1"}
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="halo-wheel-", dir=out_dir) as tmp:
        argv = [uv, "build", "--wheel", "--no-build-isolation", "--offline", "--no-config"]
        argv += ["--python", sys.executable, "--out-dir", tmp, str(repo)]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        built = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or len(built) != 1:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel"]
            raise HaloError(f"{repo / 'pyproject.toml'}: uv build failed: {tail[0]}")
        got = _halo_files(built[0])
        want = {p.relative_to(repo).as_posix() for p in tree_files(repo / "halo")}
        if got != want:
            odd = sorted(got ^ want)
            raise HaloError(
                f"{repo / 'pyproject.toml'}: the build backend packed other files than halo/'s "
                f"hashed tree ({len(odd)}: {', '.join(odd[:3])})"
            )
        out = out_dir / built[0].name
        built[0].replace(out)
    return out
