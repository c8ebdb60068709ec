"""Bases: Debian made here by mmdebstrap, offline, from the .debs its OS lock pins.

A made base is addressed by its recipe (the catalog entry and its OS lock,
pins/debian.BASE.lock.toml): its tag carries the recipe hash, its config carries it in
full (``BASE_LABEL``), and the recipe hash (not the image ID made here) is what every image and
derivation on it hashes (halo.images.inputs.base_identity): a plan is the same before and after
`halo image base`, and on a host with no engine. A made base counts as made only when its label
names the recipe in full. The .debs come from the store (`halo fetch BASE`, verified by
sha256); mmdebstrap installs them from a flat local repository with no network, so the same
lock gives the same tar bytes, and the same image ID, on another day and another machine.
"""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from halo.atomic import exclusive
from halo.errors import HaloError
from halo.hashing import sha256_bytes, sha256_file, sha256_json
from halo.images.catalog import Base
from halo.images.docker import Docker
from halo.pins.deblock import DebInputs, DebLock, deb_lock_path, load_deb_lock
from halo.report import say

# Timestamps inside made bases (file mtimes via mmdebstrap, the image's `created`).
DEFAULT_EPOCH = 1793491200  # 2026-11-01T00:00:00Z
BASE_LABEL = "io.halo.base-recipe"  # the full recipe hash, in a made base's config


def source_date_epoch() -> int:
    return int(os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_EPOCH))


def deb_inputs(base: Base) -> DebInputs:
    """What the base's OS lock is resolved for."""
    return DebInputs(base.name, base.suite, base.variant, tuple(sorted(base.packages)))


def os_lock_file(base: Base, repo: Path) -> Path:
    path = deb_lock_path(repo / "pins", base.name)
    if not path.is_file():
        raise HaloError(f"{path}: OS lock not found; run `halo pins lock --os {base.name}`")
    return path


def recipe_hash(base: Base, repo: Path) -> str:
    definition: dict[str, object] = dict(base.definition)
    definition["mount_points"] = list(MOUNT_POINTS)
    definition["os_lock_sha256"] = sha256_file(os_lock_file(base, repo))
    # How a base is made from its lock is this file: a change to it is a new base.
    definition["make_sha256"] = sha256_file(Path(__file__))
    return sha256_json(definition)


def base_ref(base: Base, repo: Path) -> str:
    return f"halo-base/{base.name}:{recipe_hash(base, repo)[:12]}"


@dataclass(frozen=True)
class BaseState:
    ref: str
    image_id: str | None  # None: not made (or not pulled) on this machine yet


def base_state(base: Base, repo: Path, docker: Docker | None) -> BaseState:
    """The base's reference, and its image ID when it is here and is this recipe's base."""
    ref = base_ref(base, repo)
    if docker is None:
        return BaseState(ref, None)
    found = docker.id_and_label(ref, BASE_LABEL)
    ours = found is not None and found[1] == recipe_hash(base, repo)
    return BaseState(ref, found[0] if found and ours else None)


# Paths every build step mounts something on. A base that lacks them makes BuildKit create a
# stub in each RUN step's layer, with the build's time on it; so a made base carries them,
# empty (no host name or resolver from the machine that made it).
MOUNT_POINTS = ("dev/", "etc/hostname", "etc/hosts", "etc/resolv.conf")


def mount_points_tar(out: Path, epoch: int) -> None:
    """A tiny layer holding MOUNT_POINTS: an empty folder and empty files, at ``epoch``."""
    import tarfile

    with tarfile.open(out, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name in MOUNT_POINTS:
            info = tarfile.TarInfo(name.rstrip("/"))
            info.mtime, info.uid, info.gid = epoch, 0, 0
            if name.endswith("/"):
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(b""))


def base_archive(
    rootfs_tar: Path,
    out: Path,
    epoch: int,
    created_by: str,
    env: tuple[tuple[str, str], ...] = (),
    recipe: str = "",
) -> str:
    """Wrap a rootfs tarball as an image archive for `docker load`, deterministically.

    Two layers: the rootfs, then the mount points. Returns the image ID, which Docker derives
    from exactly these config bytes, so it is known before loading.
    """
    from halo.images.reproducible import canonical, docker_archive, iso

    points = out.with_name("mount-points.tar")
    mount_points_tar(points, epoch)
    layers = [
        ("sha256:" + sha256_file(rootfs_tar), rootfs_tar),
        ("sha256:" + sha256_file(points), points),
    ]
    created = iso(epoch)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "Env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                *(f"{k}={v}" for k, v in env),
            ],
            "Cmd": ["/bin/bash"],
            **({"Labels": {BASE_LABEL: recipe}} if recipe else {}),
        },
        "rootfs": {"type": "layers", "diff_ids": [d for d, _ in layers]},
        "history": [
            {"created": created, "created_by": created_by},
            {"created": created, "created_by": "halo: mount points " + " ".join(MOUNT_POINTS)},
        ],
    }
    data = canonical(config)
    docker_archive(out, data, [], layers, epoch)
    return "sha256:" + sha256_bytes(data)


def _debian_mirror(suite: str) -> str:
    """The configured mirror, or "" when none is: then only the store can serve (offline)."""
    from halo.sources import debian_mirror

    try:
        return debian_mirror(suite)
    except HaloError:
        return ""


def fetch_debs(lock: DebLock, store: object) -> None:
    """The lock's .debs into the store (network only for what is missing or corrupt)."""
    from halo.sources import substitute_dirs
    from halo.store.debfetch import DebMirror, as_lock
    from halo.store.fetch import fetch_lock, summary

    mirror = DebMirror.for_locks(_debian_mirror(lock.inputs.suite), [lock])
    results = fetch_lock(as_lock(lock), store, mirror, substitute_dirs())  # type: ignore[arg-type]
    say(summary(lock.inputs.base, results).splitlines()[0])


def flat_repository(lock: DebLock, store: object, folder: Path, epoch: int) -> None:
    """A flat apt repository of the lock's .debs, each verified against the lock on the way.

    The Release names the suite (mmdebstrap picks the Essential set by it); its date is the
    fixed epoch, and apt's lists are removed from the made root anyway.
    """
    from halo.store.store import Store

    assert isinstance(store, Store)
    folder.mkdir(parents=True, exist_ok=True)
    for deb in lock.debs:
        store.verify(deb.sha256, deb.file, fix=f"halo fetch {lock.inputs.base}")
        store.link_into(deb.sha256, folder / deb.file)
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
    suite = lock.inputs.suite
    release = [f"-oAPT::FTPArchive::Release::{k}={suite}" for k in ("Suite", "Codename")] + [
        f"-oAPT::FTPArchive::Release::Architectures={lock.inputs.architecture}"
    ]
    for argv, out in (
        (["apt-ftparchive", "packages", "."], "Packages"),
        (["apt-ftparchive", *release, "release", "."], "Release"),
    ):
        try:
            proc = subprocess.run(argv, cwd=folder, env=env, capture_output=True, check=False)
        except FileNotFoundError:
            raise HaloError("apt-ftparchive: not found; install Debian's apt-utils") from None
        if proc.returncode != 0:
            raise HaloError(f"apt-ftparchive {argv[1]}: {proc.stderr.decode().strip()[-300:]}")
        (folder / out).write_bytes(proc.stdout)


# What the made root's apt sources say: no local path, no mirror of the machine that made it
# (either would differ between machines, and so would the image ID).
SOURCES_NOTE = (
    "# This base was made offline by halo from the .debs its OS lock pins\\n"
    "# (pins/debian.{base}.lock.toml). Add a Debian source here to install more.\\n"
)


def _mmdebstrap(base: Base, lock: DebLock, repo_dir: Path, rootfs: Path, epoch: int) -> None:
    argv = [
        "mmdebstrap",
        f"--variant={base.variant}",
        "--architectures=amd64",
        # Every locked package by name: the lock is the closure. (The variant alone would pick
        # Priority: required packages, a field a flat repository's index does not carry.)
        f"--include={','.join(sorted({d.name for d in lock.debs}))}",
        "--skip=output/dev",
        # Docs, man pages and locales are not needed in an image and only add bytes.
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        '--customize-hook=rm -f "$1"/etc/hostname "$1"/etc/resolv.conf',
        f"--customize-hook=printf '{SOURCES_NOTE.format(base=base.name)}' > \"$1\"/etc/apt/sources.list",
        f"--customize-hook=chroot \"$1\" dpkg-query -W -f '{INSTALLED_FORMAT}' > {shlex.quote(str(repo_dir.parent / 'installed.tsv'))}",
        base.suite,
        str(rootfs),
        f"deb [trusted=yes] copy://{repo_dir} ./",
    ]
    if os.geteuid() == 0:
        # As root, no network at all; as a user, mmdebstrap's own namespaces, and the only
        # source is the local folder anyway.
        argv = ["unshare", "--net", *argv]
    say(
        f"base {base.name}: mmdebstrap {base.suite} offline from the store, SOURCE_DATE_EPOCH={epoch}"
    )
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise HaloError(
            "mmdebstrap: not found; install Debian's mmdebstrap to make a base"
        ) from None
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:]
        raise HaloError(f"base {base.name}: mmdebstrap failed: {' | '.join(tail)}")
    _same_as_lock(base, lock, repo_dir.parent / "installed.tsv")


INSTALLED_FORMAT = r"${Package}\t${Version}\t${Architecture}\n"


def _same_as_lock(base: Base, lock: DebLock, installed: Path) -> None:
    """The made root holds exactly the lock's packages, or nothing is loaded."""
    got = {tuple(line.split("\t")) for line in installed.read_text().splitlines() if line}
    want = {(d.name, d.version, d.architecture) for d in lock.debs}
    if got != want:
        extra = sorted(f"{n} {v}" for n, v, _ in got - want)[:3]
        missing = sorted(f"{n} {v}" for n, v, _ in want - got)[:3]
        raise HaloError(
            f"base {base.name}: the made root differs from pins/debian.{base.name}.lock.toml: "
            f"not locked {extra or 'none'}, not installed {missing or 'none'}"
        )


def checked_lock(base: Base, repo: Path) -> DebLock:
    """The base's OS lock, refused when it breaks an invariant or was locked for other inputs."""
    from halo.pins.deblock import check_deb_lock

    path = os_lock_file(base, repo)
    lock = load_deb_lock(path)
    problems = check_deb_lock(lock, str(path), deb_inputs(base))
    if problems:
        raise HaloError(
            problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
        )
    return lock


def make_rootfs(base: Base, lock: DebLock, store: object, out: Path, epoch: int) -> None:
    """The base's root filesystem tar at ``out``, from the store alone."""
    with tempfile.TemporaryDirectory(prefix="halo-debs.") as tmp:
        # mmdebstrap's copy:// source: a folder the chroot can read (not file://).
        repo_dir = Path(tmp) / "repo"
        flat_repository(lock, store, repo_dir, epoch)
        _mmdebstrap(base, lock, repo_dir, out, epoch)


def make_base(base: Base, repo: Path, docker: Docker, workdir: Path) -> BaseState:
    """Make (or find) a base on this machine: fetch its .debs (the only network step), then
    make it offline from the store."""
    state = base_state(base, repo, docker)
    if state.image_id:
        say(f"base {base.name}: present ({state.ref}, {state.image_id[:19]})")
        return state
    docker.ping()  # "not here" must not be an engine that does not answer
    # Two builds of one run may need the same base at once: the first makes it, the second
    # waits and finds it (per engine).
    from halo.paths import cache_home, per_engine

    with exclusive(per_engine(cache_home() / "locks") / f"base-{base.name}.lock"):
        state = base_state(base, repo, docker)
        if state.image_id:
            say(f"base {base.name}: present ({state.ref}, {state.image_id[:19]})")
            return state
        return _make(base, repo, docker, workdir, state)


def _make(base: Base, repo: Path, docker: Docker, workdir: Path, state: BaseState) -> BaseState:
    from halo.paths import store_root
    from halo.store.store import Store

    lock = checked_lock(base, repo)
    store = Store(store_root())
    fetch_debs(lock, store)
    epoch = source_date_epoch()
    workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        make_rootfs(base, lock, store, rootfs, epoch)
        archive = Path(tmp) / "image.tar"
        image_id = base_archive(
            rootfs,
            archive,
            epoch,
            f"mmdebstrap --variant={base.variant} {base.suite} +{','.join(sorted(base.packages))}"
            f" from {deb_lock_path(Path('pins'), base.name)} (offline)",
            base.env,
            recipe_hash(base, repo),
        )
        docker.load(archive)
        docker.tag(image_id, state.ref)
    say(f"base {base.name}: made {state.ref} ({image_id[:19]})")
    return BaseState(state.ref, image_id)
