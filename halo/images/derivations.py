"""Source builds as derivations: a wheel addressed by the hash of everything that made it.

Inputs: the source tree's content hash (and subfolder), the builder base's digest, the
Python, the exact wheels installed before building (by sha256: torch, CUDA headers, build
tools), and the build environment (CUDA arch list, feature flags). Parallelism knobs
(MAX_JOBS, NVCC_THREADS) only change how fast, so they are set from this host and left out.
A derivation whose record exists in the store, with its wheel, is not built again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from halo.atomic import staged_dir, write_text
from halo.errors import HaloError
from halo.hashing import sha256_file, sha256_json, sha256_tree
from halo.images.catalog import Base, Catalog, Image
from halo.images.docker import Docker
from halo.pins.lockfile import Artifact, Lock
from halo.pins.source_pins import SourcePin
from halo.report import Progress, say
from halo.schema import Sha256Hex, Strict, matches, read_text, validate
from halo.store.store import Store

DOCKERFILE = Path("images/builder/Dockerfile")
GIB = 1 << 30


@dataclass(frozen=True)
class Derivation:
    name: str
    source: Path  # a source tree already verified against content_sha256
    content_sha256: str
    subdirectory: str
    builder_ref: str
    builder_id: str
    python: str
    requirements: tuple[tuple[str, str, Artifact], ...]  # (name, version, wheel) installed first
    env: tuple[tuple[str, str], ...]

    @property
    def inputs(self) -> dict[str, object]:
        return {
            "name": self.name,
            "content_sha256": self.content_sha256,
            "subdirectory": self.subdirectory,
            "builder": self.builder_id,
            "python": self.python,
            "requirements": sorted(f"{n}=={v} sha256:{a.sha256}" for n, v, a in self.requirements),
            "env": dict(self.env),
            "dockerfile_sha256": None,  # filled by derivation_hash: the recipe is an input too
        }


def derivation_hash(drv: Derivation, repo: Path) -> str:
    inputs = drv.inputs
    inputs["dockerfile_sha256"] = sha256_file(repo / DOCKERFILE)
    return sha256_json(inputs)


@dataclass(frozen=True)
class Realised:
    name: str
    hash: str
    wheel: Path
    sha256: str
    built: bool  # False: reused from the store, nothing compiled


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


def _record_path(store: Store, drv_hash: str) -> Path:
    return store.root / "derivations" / f"{drv_hash}.json"


class DerivationRecord(Strict):
    """derivations/<hash>.json in the store: which wheel a derivation's inputs made."""

    wheel: Annotated[str, matches(r"[A-Za-z0-9_.+-]+\.whl", "a wheel file name")]
    sha256: Sha256Hex
    inputs: dict[str, object]


def cached(store: Store, drv_hash: str) -> tuple[str, str] | None:
    """(wheel file name, sha256) of a realised derivation whose wheel is in the store, verified.

    Checked on every use: a record that does not parse, or a wheel that no longer hashes to
    what the record says (its stamp spares the hash while the file is untouched), counts as
    not built, so the derivation is built again and both are replaced.
    """
    record = _record_path(store, drv_hash)
    if not record.is_file():
        return None
    try:
        data = validate(DerivationRecord, json.loads(read_text(record)), str(record))
    except (HaloError, ValueError) as exc:
        say(f"derivation {drv_hash[:12]}: record unusable ({exc}); building again")
        return None
    if not store.has(data.sha256):
        return None
    if store.check(data.sha256) is not None:
        say(f"derivation {drv_hash[:12]}: {data.wheel} in the store is corrupted; building again")
        return None
    return data.wheel, data.sha256


def realise(drv: Derivation, repo: Path, store: Store, docker: Docker, workdir: Path) -> Realised:
    drv_hash = derivation_hash(drv, repo)
    hit = cached(store, drv_hash)
    if hit:
        wheel, sha = hit
        say(f"derivation {drv.name}: cached ({drv_hash[:12]}, {wheel}); nothing to compile")
        return Realised(drv.name, drv_hash, _named(store, sha, wheel, workdir), sha, built=False)

    jobs, nvcc = build_jobs()
    say(
        f"derivation {drv.name}: building {drv_hash[:12]} in {drv.builder_ref} (MAX_JOBS={jobs}, NVCC_THREADS={nvcc}, network none)"
    )
    workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=workdir, prefix=f"drv-{drv.name}-") as tmp:
        ctx, out = Path(tmp) / "ctx", Path(tmp) / "out"
        _stage(drv, ctx, store)
        docker.build(
            context=ctx,
            dockerfile=repo / DOCKERFILE,
            tags=[],
            build_args={
                "BUILDER": drv.builder_ref,
                "PYTHON": drv.python,
                "SUBDIR": drv.subdirectory or ".",
                "MAX_JOBS": str(jobs),
                "NVCC_THREADS": str(nvcc),
                **{k: v for k, v in drv.env if k == "TORCH_CUDA_ARCH_LIST"},
            },
            labels={},
            network="none",
            output=out,
        )
        wheels = sorted(out.glob("*.whl"))
        if len(wheels) != 1:
            raise HaloError(
                f"derivation {drv.name}: expected one wheel from the build, got {[w.name for w in wheels]}"
            )
        sha = sha256_file(wheels[0])
        store.add_file(sha, wheels[0], wheels[0].name)
        write_text(
            _record_path(store, drv_hash),
            json.dumps(
                {"wheel": wheels[0].name, "sha256": sha, "inputs": drv.inputs},
                indent=2,
                sort_keys=True,
            )
            + "\n",
        )
        name = wheels[0].name
    say(f"derivation {drv.name}: built {name} (sha256 {sha[:12]})")
    return Realised(drv.name, drv_hash, _named(store, sha, name, workdir), sha, built=True)


def _named(store: Store, sha: str, wheel: str, workdir: Path) -> Path:
    """The store keeps bytes by hash; pip needs the wheel's own file name."""
    path = workdir / "wheels" / sha[:12] / wheel
    if not path.exists():
        store.link_into(sha, path)
    return path


def _stage(drv: Derivation, ctx: Path, store: Store) -> None:
    shutil.copytree(drv.source, ctx / "src", symlinks=True)
    wheels = ctx / "wheels"
    lines = []
    for name, version, art in drv.requirements:
        store.verify(art.sha256, art.file)
        store.link_into(art.sha256, wheels / art.file)
        lines.append(f"{name}=={version} --hash=sha256:{art.sha256}")
        if name == "pip":
            store.link_into(art.sha256, wheels / "_pip.whl")
    if not (wheels / "_pip.whl").exists():
        raise HaloError(f"derivation {drv.name}: its requirements must include pip")
    (wheels / "requirements.txt").write_text("\n".join(sorted(lines)) + "\n")
    (ctx / "env").mkdir()
    (ctx / "env" / "build.env").write_text("".join(f"{k}={_sh_quote(v)}\n" for k, v in drv.env))


def _sh_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def requirements_from(
    lock_packages: Sequence, names: Sequence[str] | None = None
) -> tuple[tuple[str, str, Artifact], ...]:
    """Wheels of a lock to install before building (all of them when ``names`` is None)."""
    from halo.pins.lockfile import normalize

    wanted = None if names is None else {normalize(n) for n in names}
    out = []
    for pkg in lock_packages:
        if wanted is not None and normalize(pkg.name) not in wanted:
            continue
        wheel = next((a for a in pkg.artifacts if a.is_wheel), None)
        if wheel is None:
            raise HaloError(f"{pkg.name}: no wheel in the lock to install in the builder")
        out.append((pkg.name, pkg.version, wheel))
    return tuple(out)


def tree_problem(pin: SourcePin, tree: Path) -> str | None:
    """Why a stored source tree is not what its pin says, or None: hashed again on every use.

    The pin's hash covers the repository's files outside its submodules; each submodule's
    covers its own folder (or the subfolder the build uses).
    """
    subs = tuple(m.path.strip("/") + "/" for m in pin.submodules)
    got = sha256_tree(tree, exclude=subs)
    if got != pin.content_sha256:
        return f"{pin.name}: content hash {got}, pin says {pin.content_sha256}"
    for m in pin.submodules:
        folder = tree / m.path / m.subdirectory if m.subdirectory else tree / m.path
        got = sha256_tree(folder) if folder.is_dir() else "missing"
        if got != m.content_sha256:
            return f"{pin.name}/{m.path}: content hash {got}, pin says {m.content_sha256}"
    return None


def source_tree(pin: SourcePin, store: Store, workdir: Path) -> Path:
    """The pinned source with its submodules, unpacked and verified by content hash (fetch phase).

    A stored tree is verified again before each use; one that changed is fetched again.
    """
    key = sha256_json([pin.content_sha256, *(m.content_sha256 for m in pin.submodules)])
    final = store.root / "sources" / key
    if final.is_dir():
        problem = tree_problem(pin, final)
        if problem is None:
            return final
        say(f"source {problem}: the stored tree changed; fetching it again")
    with staged_dir(final) as tree:
        _unpack_verified(
            pin.repository, pin.commit, pin.content_sha256, "", tree, pin.name, workdir
        )
        for sub in pin.submodules:
            dest = tree / sub.path
            shutil.rmtree(dest, ignore_errors=True)
            _unpack_verified(
                sub.repository,
                sub.commit,
                sub.content_sha256,
                sub.subdirectory,
                dest,
                f"{pin.name}/{sub.path}",
                workdir,
            )
    return final


def _unpack_verified(
    repository: str,
    commit: str,
    want: str,
    subdirectory: str,
    dest: Path,
    label: str,
    workdir: Path,
) -> None:
    from halo.pins.source_hash import source_hash
    from halo.store.index import IndexClient

    url = f"{repository.rstrip('/')}/archive/{commit}.tar.gz"
    workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        archive = Path(tmp) / "src.tar.gz"
        length, chunks = IndexClient.download(url)
        progress = Progress(f"{label}@{commit[:12]}", length)
        with archive.open("wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
                progress.advance(len(chunk))
        progress.finish()
        got = source_hash(archive, subdirectory)
        if got != want:
            raise HaloError(
                f"{label}: source of {commit} has content hash {got}, pin says {want}; not kept"
            )
        unpacked = Path(tmp) / "x"
        with tarfile.open(archive) as tf:
            tf.extractall(unpacked, filter="data")
        (root,) = list(unpacked.iterdir())
        shutil.copytree(root, dest, symlinks=True, dirs_exist_ok=True)


def derivation_for(
    pin: SourcePin,
    image: Image,
    builder: Base,
    builder_ref: str,
    builder_id: str,
    lock: Lock,
    source: Path,
) -> Derivation:
    """The derivation of one source pin for one image: what both the build and the plan hash."""
    arch = pin.cuda_arch.get(image.pins) or ";".join(image.cuda_arch)
    return Derivation(
        name=pin.name,
        source=source,
        content_sha256=pin.content_sha256,
        subdirectory=pin.subdirectory,
        builder_ref=builder_ref,
        builder_id=builder_id,
        python=builder.python,
        requirements=requirements_from(lock.packages),
        env=tuple(sorted({**pin.env, "TORCH_CUDA_ARCH_LIST": arch}.items())),
    )


def build_sources(
    repo: Path, catalog: Catalog, image: Image, store: Store, docker: Docker
) -> list[tuple[Path, str]]:
    """Realise every source pin of an image; returns (wheel, sha256) for the kernels layer."""
    from halo.images.base import base_state
    from halo.paths import cache_home
    from halo.pins.lockfile import load_lock, lock_path
    from halo.pins.source_pins import load_source_pins

    pins = {p.name: p for p in load_source_pins(repo / "pins")}
    builder = catalog.bases[image.builder or image.base]
    state = base_state(builder, repo, docker)
    if not state.image_id:
        raise HaloError(f"base {builder.name}: not made; run `halo image base {image.name}`")
    lock = load_lock(lock_path(repo / "pins", image.pins))
    work = cache_home() / "work"
    out = []
    for name in image.sources:
        drv = derivation_for(pins[name], image, builder, state.ref, state.image_id, lock, Path())
        if cached(store, derivation_hash(drv, repo)) is None:  # the source is needed to build
            drv = dataclasses.replace(drv, source=source_tree(pins[name], store, work))
        realised = realise(drv, repo, store, docker, work)
        out.append((realised.wheel, realised.sha256))
    return out
