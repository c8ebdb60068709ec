"""The toolchain a derivation compiles with, and what of it enters the derivation hash.

A toolchain is locked wheels (for the CUDA images the ``cuda-builder`` set: nvcc, the CUDA
headers, torch, the build tools) installed by the images' own install step into a builder
venv, whose ``VENV/cuda`` is the CUDA_HOME (halo.stack.cuda_home), on an interpreter and a
host that decide the rest of the output:

- ``native``: on this host, in a network-less namespace (halo.builder.native). The
  interpreter's version and ABI, the C library and the C/C++ compilers are inputs: a wheel
  built with GCC 12 against glibc 2.36 is another output than one from Ubuntu 24.04.
- ``docker``: images/builder/Dockerfile on a made or pinned base, whose recipe hash (the
  OS packages, the interpreter, the compilers it installs) or pinned digest stands for all
  of that; the base is reproducible from its recipe, so no image ID made here is an input.

The builder venv of a native toolchain is itself content-addressed: one folder per
toolchain identity under ``$HALO_BUILDERS`` (default ``<cache>/builders``), reused while its
stamp matches, made again when anything in the identity changes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from halo.atomic import exclusive, write_text
from halo.errors import HaloError
from halo.hashing import sha256_file, sha256_json
from halo.pins.lockfile import Artifact, Lock, normalize
from halo.report import say
from halo.stack import install_step
from halo.stack.stage import INSTALL_MODULES, install_argv, stage_install_step
from halo.store.store import Store

BUILDERS_VAR = "HALO_BUILDERS"
STAMP = ".halo-builder.json"
Requirement = tuple[str, str, Artifact]  # (name, version, wheel)

_ASK_ABI = (
    "import sys, sysconfig; print(sys.implementation.name, '%d.%d' % sys.version_info[:2], "
    "sysconfig.get_config_var('SOABI'))"
)


@dataclass(frozen=True)
class Toolchain:
    kind: str  # "native" | "docker"
    requirements: tuple[Requirement, ...]  # installed into the builder venv before building
    python: str  # native: the interpreter's path (not hashed); docker: its name in the base
    host: tuple[tuple[str, str], ...]  # what else decides the output (abi, libc, compilers | base)
    base_ref: str = ""  # docker: the image the builder stage starts FROM

    def identity(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "host": dict(self.host),
            "requirements": sorted(f"{n}=={v} sha256:{a.sha256}" for n, v, a in self.requirements),
        }


def requirements_from(lock: Lock, names: Sequence[str] | None = None) -> tuple[Requirement, ...]:
    """Wheels of a lock to install before building (all of them when ``names`` is None)."""
    wanted = None if names is None else {normalize(n) for n in names}
    out = []
    for pkg in lock.packages:
        if wanted is not None and normalize(pkg.name) not in wanted:
            continue
        wheel = next((a for a in pkg.artifacts if a.is_wheel), None)
        if wheel is None:
            raise HaloError(f"{pkg.name}: no wheel in pins/pylock.{lock.set}.toml for the builder")
        out.append((pkg.name, pkg.version, wheel))
    if not any(normalize(n) == "pip" for n, _, _ in out):
        raise HaloError(f"pins/pylock.{lock.set}.toml: a builder needs pip among its wheels")
    return tuple(out)


def _first_line(argv: Sequence[str]) -> str:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "absent"
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    return lines[0].strip() if proc.returncode == 0 and lines else "absent"


# System headers that source pins compile against and no wheel provides, with where they
# come from: NVSHMEM's IBGDA headers (DeepEP) include rdma-core's mlx5dv.h.
HOST_HEADERS = {
    "infiniband/mlx5dv.h": "rdma-core's headers (Debian/Ubuntu: libibverbs-dev)",
    "infiniband/verbs.h": "rdma-core's headers (Debian/Ubuntu: libibverbs-dev)",
}
INCLUDE_DIRS = (Path("/usr/local/include"), Path("/usr/include"))


def host_header(rel: str) -> str:
    """sha256 of a system header as the compiler finds it, or "absent"."""
    for folder in INCLUDE_DIRS:
        if (folder / rel).is_file():
            return sha256_file(folder / rel)
    return "absent"


def native_host(python: str) -> tuple[tuple[str, str], ...]:
    """This host, as far as it decides a compiled wheel: interpreter ABI, libc, compilers, and
    the system headers of HOST_HEADERS (by content: any distribution's copy that is the same).

    The interpreter enters by implementation, major.minor and SOABI (the ABI a ``cp312``
    extension is built for), not its patch release, which does not change the ABI.
    """
    abi = _first_line([python, "-I", "-c", _ASK_ABI])
    if abi == "absent":
        raise HaloError(f"{python}: does not run; the native builder needs its interpreter")
    libc = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None
    return (
        ("python", abi),
        ("libc", libc or "unknown"),
        ("cc", _first_line(["gcc", "--version"])),
        ("c++", _first_line(["c++", "--version"])),
        *((f"header {rel}", host_header(rel)) for rel in sorted(HOST_HEADERS)),
    )


def native_toolchain(lock: Lock, python: str, names: Sequence[str] | None = None) -> Toolchain:
    return Toolchain("native", requirements_from(lock, names), python, native_host(python))


def docker_toolchain(
    lock: Lock, python: str, base_ref: str, base_identity: str, names: Sequence[str] | None = None
) -> Toolchain:
    """``base_identity``: ``recipe:<hash>`` of a made base, or a pinned base's digest."""
    return Toolchain(
        "docker", requirements_from(lock, names), python, (("base", base_identity),), base_ref
    )


def install_step_sha256() -> str:
    """The install step's code: how a builder venv (and its CUDA_HOME) is made."""
    package = Path(__file__).resolve().parents[1]
    return sha256_json({rel: sha256_file(package / rel) for rel in INSTALL_MODULES})


def stage_wheels(dest: Path, requirements: Sequence[Requirement], store: Store) -> None:
    """``dest``: the verified wheels, their requirements.txt and pip, as the install step wants."""
    dest.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, version, art in requirements:
        store.verify(art.sha256, art.file)
        store.link_into(art.sha256, dest / art.file)
        lines.append(f"{name}=={version} --hash=sha256:{art.sha256}")
        if normalize(name) == "pip":
            store.link_into(art.sha256, dest / install_step.PIP_WHEEL)
    (dest / install_step.REQUIREMENTS).write_text("\n".join(sorted(lines)) + "\n")


def builders_root() -> Path:
    from halo.paths import cache_home

    return Path(os.environ.get(BUILDERS_VAR) or cache_home() / "builders")


def builder_key(tc: Toolchain) -> str:
    """What the builder venv is made of: its wheels, its interpreter, the install step (the
    host's compilers and headers are used by builds, not installed into it)."""
    identity = tc.identity()
    return sha256_json(
        {
            "requirements": identity["requirements"],
            "python": dict(tc.host).get("python"),
            "interpreter": tc.python,
            "install_step": install_step_sha256(),
        }
    )


def _stamped(venv: Path, key: str) -> bool:
    try:
        return json.loads((venv / STAMP).read_text()).get("key") == key
    except (OSError, ValueError, AttributeError):
        return False


def builder_venv(tc: Toolchain, store: Store, patches_dir: Path, workdir: Path) -> Path:
    """The native toolchain's venv, installed offline from the store by the install step."""
    key = builder_key(tc)
    venv = builders_root() / key[:16]
    venv.parent.mkdir(parents=True, exist_ok=True)
    # One installer at a time: two builds on this host wait for one venv, not fight over it.
    with exclusive(venv.parent / f"{venv.name}.lock"):
        if not _stamped(venv, key):
            _install(tc, key, venv, store, patches_dir, workdir)
    return venv


def _install(
    tc: Toolchain, key: str, venv: Path, store: Store, patches_dir: Path, workdir: Path
) -> None:
    say(f"builder: installing {len(tc.requirements)} locked wheels into {venv} (offline)")
    stage = workdir / f"builder-{key[:12]}"
    shutil.rmtree(stage, ignore_errors=True)
    # Installed in place (console scripts such as ninja's name their venv's path) with the
    # stamp written last: a venv without its stamp is half-made and is made again.
    shutil.rmtree(venv, ignore_errors=True)
    try:
        stage_wheels(stage / "wheels", tc.requirements, store)
        stage_install_step(stage / "install", patches_dir)
        argv = install_argv(tc.python, str(stage / "install"), str(venv), str(stage / "wheels"))
        log = stage / "install.log"
        with log.open("w") as out:
            rc = subprocess.run(
                argv,
                env=install_step.clean_env(os.environ),
                stdout=out,
                stderr=subprocess.STDOUT,
                check=False,
            ).returncode
        if rc != 0:
            kept = venv.with_name(f"{venv.name}.install.log")
            shutil.copyfile(log, kept)
            tail = [ln for ln in log.read_text().splitlines() if ln.strip()][-1:]
            shutil.rmtree(venv, ignore_errors=True)
            raise HaloError(
                f"builder: the install step exited {rc}: {tail[0] if tail else 'no output'} (log: {kept})"
            )
        write_text(venv / STAMP, json.dumps({"key": key, **tc.identity()}, indent=1) + "\n")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
