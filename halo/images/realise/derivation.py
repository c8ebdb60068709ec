"""Realise a source derivation: its wheel from the store, the binary cache, or compiled.

``realise`` looks in the store (the record and its wheel, verified now), then in the binary
cache (halo.cache: trusted only through the recorded output hash and a signature or a
pinned digest), and only then compiles: in Docker on the builder base (the default; the base
must be made here and carry its recipe hash), or natively in a network-less namespace when
``HALO_BUILDER=native`` asks for it (halo.builder.kind). The node (halo.images.graph) carries
the inputs and their hash as evaluation computed them; nothing here hashes them again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from packaging.utils import parse_wheel_filename
from packaging.version import Version

from halo.atomic import exclusive
from halo.builder.record import Compile, DerivationRecord, read_record, write_record
from halo.builder.toolchain import Toolchain, builder_venv
from halo.errors import HaloError
from halo.hashing import sha256_file
from halo.images.docker import Docker
from halo.images.graph import BASE_LABEL, DerivationNode
from halo.patching.source import fingerprint, patch_tree, source_patches
from halo.pins.lockfile import normalize
from halo.pins.source_pins import SourcePin
from halo.report import say
from halo.store.sources import Download, source_tree
from halo.store.store import Store

if TYPE_CHECKING:
    from halo.builder.docker import DockerBuild

GIB = 1 << 30


class Cache(Protocol):
    """The binary cache as realise sees it (halo.cache.oci.RegistryCache)."""

    def pull(self, drv_hash: str, store: Store) -> DerivationRecord | None: ...


def build_jobs(
    cores: int | None = None, mem_bytes: int | None = None, gib_per_job: float = 4.0
) -> tuple[int, int]:
    """(MAX_JOBS, NVCC_THREADS) that fit this host: nvcc jobs are memory-bound, not core-bound."""
    cores = cores or os.cpu_count() or 1
    mem_bytes = mem_bytes or _available_memory()
    nvcc_threads = 2 if cores >= 16 else 1
    by_mem = int(mem_bytes / (gib_per_job * GIB * nvcc_threads))
    return max(1, min(cores // nvcc_threads, by_mem)), nvcc_threads


def _available_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * GIB


def parallelism() -> dict[str, str]:
    """MAX_JOBS / NVCC_THREADS: the caller's, else what fits this host. Never hashed."""
    jobs, threads = build_jobs()
    return {
        "MAX_JOBS": os.environ.get("MAX_JOBS") or str(jobs),
        "NVCC_THREADS": os.environ.get("NVCC_THREADS") or str(threads),
    }


@dataclass(frozen=True)
class Realised:
    name: str
    hash: str
    wheel: Path
    sha256: str
    origin: str  # "store", "cache" (pulled, nothing compiled) or "built"
    seconds: float = 0.0

    @property
    def built(self) -> bool:
        return self.origin == "built"


@dataclass(frozen=True)
class Realiser:
    """Where realise finds and keeps things; side effects live behind these."""

    repo: Path
    store: Store
    workdir: Path
    cache: Cache | None = None
    docker: Docker | None = None
    substitutes: tuple[Path, ...] = ()
    download: Download | None = None
    keep_log: Path | None = None  # a folder that keeps each build's log
    patches: Path | None = None  # the patches folder; default: the repository's

    @property
    def patches_dir(self) -> Path:
        return self.patches or self.repo / "patches"


def realise(drv: DerivationNode, r: Realiser) -> Realised:
    """The derivation's wheel: from the store, the binary cache, or compiled offline. The
    record names exactly the inputs the plan hashed (the node carries both)."""
    inputs, drv_hash = drv.inputs, drv.hash
    record = read_record(r.store, drv_hash)
    origin = "store"
    if record is None and r.cache is not None:
        record = r.cache.pull(drv_hash, r.store)
        if record is not None:
            write_record(r.store, record)
            origin = "cache"
    if record is not None:
        say(
            f"derivation {drv.name}: {origin} ({drv_hash[:12]}, {record.wheel}); nothing to compile"
        )
        wheel = _named(r.store, record.sha256, record.wheel, r.workdir)
        return Realised(drv.name, drv_hash, wheel, record.sha256, origin)
    # Two builds of one run may need the same derivation at once: the first compiles it, the
    # second waits for its record instead of compiling it again.
    from halo.paths import cache_home

    with exclusive(cache_home() / "locks" / f"drv-{drv_hash[:32]}.lock"):
        if read_record(r.store, drv_hash) is not None:
            return realise(drv, r)
        return _build(drv, inputs, drv_hash, r)


@contextlib.contextmanager
def _staged(drv: DerivationNode, r: Realiser) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """(work folder, patched source tree, parallelism) of one build: what a build and the
    first-object probe both start from. The docker builder's base is checked before anything
    is fetched."""
    tc = drv.toolchain
    if tc.kind == "docker":
        if r.docker is None:
            raise HaloError(f"derivation {drv.name}: the docker builder needs a Docker engine")
        _require_builder_base(tc, r.docker, drv.name)
    tree = source_tree(drv.pin, r.store, r.workdir, r.substitutes, r.download)
    parallel = parallelism()
    r.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=r.workdir, prefix=f"drv-{drv.name}-") as tmp:
        work = Path(tmp)
        src = work / "src"
        shutil.copytree(tree, src, symlinks=True)
        applied = patch_tree(
            src, drv.pin.distribution, drv.pin.version, _patches(r.patches_dir, drv)
        )
        for res in applied:
            say(f"  source patch {res.name}: {res.state}")
        yield work, src, parallel


def _docker_job(
    drv: DerivationNode, r: Realiser, work: Path, src: Path, parallel: dict[str, str]
) -> DockerBuild:
    from halo.builder.docker import DockerBuild

    assert r.docker is not None  # checked by _staged
    return DockerBuild(
        drv.toolchain, src, drv.pin.subdirectory, dict(drv.env), parallel, work, r.repo,
        r.docker, r.store, drv.name, drv.pin.probe, drv.pin.probe_defines,
    )  # fmt: skip


def host_compiles(drv: DerivationNode) -> None:
    """Kernels compile on a host of their platform: an arm64 nvcc under qemu would take days.
    Elsewhere the wheel must come from the store or the binary cache (compiled on one)."""
    if drv.platform.machine != os.uname().machine:
        raise HaloError(
            f"derivation {drv.name} ({drv.hash[:12]}) for {drv.platform}: not in the store or "
            f"the cache, and this {os.uname().machine} host does not compile for "
            f"{drv.platform.machine}; realise it on a {drv.platform} host (HALO_CACHE shares it)"
        )


def _build(drv: DerivationNode, inputs: dict[str, object], drv_hash: str, r: Realiser) -> Realised:
    host_compiles(drv)
    tc = drv.toolchain
    start = time.monotonic()
    with _staged(drv, r) as (work, src, parallel):
        say(
            f"derivation {drv.name}: compiling {drv_hash[:12]} ({tc.kind}, network none, "
            f"MAX_JOBS={parallel['MAX_JOBS']}, NVCC_THREADS={parallel['NVCC_THREADS']})"
        )
        env = {**dict(drv.env), **parallel}
        if tc.kind == "native":
            from halo.builder import native

            venv = builder_venv(tc, r.store, r.patches_dir, r.workdir)
            try:
                wheel = native.build_wheel(venv, work, drv.pin.subdirectory, env, drv.name)
            finally:
                _keep_log(work / "build.log", r.keep_log, f"{drv.name}-{drv_hash[:12]}.log")
        else:
            from halo.builder import docker as docker_build

            wheel = docker_build.build_wheel(_docker_job(drv, r, work, src, parallel))
        _check_wheel(drv.pin, wheel)
        sha = sha256_file(wheel)
        r.store.add_file(sha, wheel, wheel.name)
        seconds = time.monotonic() - start
        record = DerivationRecord(
            name=drv.name,
            hash=drv_hash,
            wheel=wheel.name,
            sha256=sha,
            inputs=inputs,
            compile=Compile(
                seconds=round(seconds, 1),
                jobs=int(parallel["MAX_JOBS"]),
                cores=os.cpu_count() or 1,
            ),
        )
        write_record(r.store, record)
    say(f"derivation {drv.name}: built {wheel.name} in {seconds:.0f}s (sha256 {sha[:12]})")
    return Realised(
        drv.name, drv_hash, _named(r.store, sha, wheel.name, r.workdir), sha, "built", seconds
    )


@dataclass(frozen=True)
class FirstObject:
    """What the first-object probe saw: the build's first nvcc object, compiled and kept."""

    name: str
    hash: str
    nvcc: str  # the compiler that ran (the toolchain's, never a downloaded one)
    command: str  # nvcc's arguments
    targets: tuple[str, ...]  # every -gencode/-arch it compiled for
    size: int  # bytes of the object
    compile_s: float  # the nvcc call alone
    seconds: float  # the whole probe: the builder's toolchain install, setup.py, the object

    @property
    def source(self) -> str:
        """The translation unit nvcc compiled (the build's first .cu)."""
        return next((w for w in self.command.split() if w.endswith(".cu")), "?")


def first_object(drv: DerivationNode, r: Realiser, keep: Path | None = None) -> FirstObject:
    """Run the derivation's build in the builder image up to its first nvcc object, then stop:
    a check of the source, its patches and the toolchain before the hours of a full compile.
    Nothing enters the store; ``keep`` is a folder that receives the object file."""
    if drv.toolchain.kind != "docker":
        raise HaloError(
            f"derivation {drv.name}: the first-object probe runs in the builder image "
            "(HALO_BUILDER=docker, the default)"
        )
    from halo.builder import docker as docker_build

    start = time.monotonic()
    with _staged(drv, r) as (work, src, parallel):
        say(f"derivation {drv.name}: compiling up to its first nvcc object (docker, network none)")
        text, obj = docker_build.first_object(_docker_job(drv, r, work, src, parallel))
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(obj, keep / f"{drv.name}-first.o")
            (keep / f"{drv.name}-first.txt").write_text(text)  # its nvcc command line
        size = obj.stat().st_size
    head, command = [*text.splitlines(), ""][:2]
    fields = dict(part.split("=", 1) for part in head.split() if "=" in part)
    return FirstObject(
        name=drv.name,
        hash=drv.hash,
        nvcc=fields.get("nvcc", "?"),
        command=command,
        targets=tuple(sorted(nvcc_targets(command))),
        size=size,
        compile_s=float(fields.get("seconds", "0")),
        seconds=time.monotonic() - start,
    )


def nvcc_targets(command: str) -> set[str]:
    """Every target an nvcc command line names: ``-gencode X``, ``-gencode=X``, ``-arch=sm_XX``."""
    words = command.split()
    found = {words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-gencode", "-arch")}
    found |= {w.split("=", 1)[1] for w in words if w.startswith(("-gencode=", "-arch="))}
    return found


def _keep_log(log: Path, folder: Path | None, name: str) -> None:
    """Keep a build's log (success or failure) outside the build folder, which goes away."""
    if folder is not None and log.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, folder / name)
        say(f"  build log: {folder / name}")


def _patches(patches_dir: Path, drv: DerivationNode) -> list:
    chosen = source_patches(patches_dir, drv.pin.distribution)
    if sorted(fingerprint(chosen).items()) != list(drv.patches):
        raise HaloError(f"derivation {drv.name}: patches/sources/ changed since it was planned")
    return chosen


def _check_wheel(pin: SourcePin, wheel: Path) -> None:
    name, version, _, _ = parse_wheel_filename(wheel.name)
    if normalize(name) != normalize(pin.distribution) or version != Version(pin.version):
        raise HaloError(
            f"derivation {pin.name}: the build made {name} {version}, the pin says "
            f"{pin.distribution} {pin.version} (pins/sources.toml)"
        )


def _named(store: Store, sha: str, wheel: str, workdir: Path) -> Path:
    """The store keeps bytes by hash; pip needs the wheel's own file name."""
    path = workdir / "wheels" / sha[:12] / wheel
    if not path.exists():
        store.link_into(sha, path)
    return path


def _require_builder_base(tc: Toolchain, docker: Docker, label: str) -> None:
    """The builder base the hash names must be here before compiling on it: a made base by
    its full recipe hash (its label), a pinned one by its digest reference."""
    named = dict(tc.host).get("base", "")
    found = docker.id_and_label(tc.base_ref, BASE_LABEL)
    if named.startswith("recipe:"):
        ok = found is not None and found[1] == named.removeprefix("recipe:")
    else:
        ok = found is not None
    if not ok:
        raise HaloError(
            f"derivation {label}: builder base {tc.base_ref} is not made here (or is not the "
            "recipe the derivation hash names); run `halo image base IMAGE` first"
        )


def realiser(repo: Path, store: Store, docker: Docker | None, cache: Cache | None) -> Realiser:
    from halo.paths import cache_home
    from halo.store.sources import substitute_dirs

    return Realiser(
        repo=repo,
        store=store,
        workdir=cache_home() / "work",
        cache=cache,
        docker=docker,
        substitutes=tuple(substitute_dirs()),
        keep_log=cache_home() / "logs",
    )
