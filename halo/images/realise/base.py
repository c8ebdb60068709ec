"""Make a base: Debian by mmdebstrap, offline, from the .debs its OS lock pins.

A base node of the plan (halo.images.graph.MakeBase) names its recipe hash and reference; a
made base counts as made only when its label carries that recipe in full. The .debs come from
the store (fetched by the FetchDebs node, verified by sha256); mmdebstrap installs them from a
flat local repository with no network, so the same lock gives the same tar bytes, and the same
image ID, on another day and another machine.

For another architecture (linux/arm64 on an amd64 host) mmdebstrap unpacks the target's .debs
itself; only the packages' maintainer scripts run as arm64 programs, through qemu-user-static
and the kernel's binfmt_misc (`qemu_ready` says what is missing). The bytes do not depend on
the emulator: a second make gives the same tar.
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
from halo.hashing import sha256_bytes, sha256_file
from halo.images.catalog_types import Base
from halo.images.docker import Docker
from halo.images.graph import BASE_LABEL, MOUNT_POINTS, FetchDebs, MakeBase, source_date_epoch
from halo.pins.deblock import DebLock, check_deb_lock, load_deb_lock
from halo.report import say


@dataclass(frozen=True)
class BaseState:
    ref: str
    image_id: str | None  # None: not made (or not pulled) on this machine yet


def base_state(node: MakeBase, docker: Docker | None) -> BaseState:
    """The base's reference, and its image ID when it is here and is this recipe's base."""
    if docker is None:
        return BaseState(node.ref, None)
    found = docker.id_and_label(node.ref, BASE_LABEL)
    ours = found is not None and found[1] == node.recipe
    return BaseState(node.ref, found[0] if found and ours else None)


def mount_points_tar(out: Path, epoch: int) -> None:
    """A tiny layer holding MOUNT_POINTS: an empty folder and empty files, at ``epoch``.

    Every build step mounts something on these paths; a base without them makes BuildKit
    create a stub in each RUN step's layer, with the build's time on it."""
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
    architecture: str = "amd64",
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
        "architecture": architecture,
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
    if architecture == "arm64":
        config["variant"] = "v8"  # as the OCI image index names arm64 (and docker reports it)
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
INSTALLED_FORMAT = r"${Package}\t${Version}\t${Architecture}\n"
# What binfmt_misc registers for arm64 programs (qemu-user-static's binfmt-support entry).
QEMU_BINFMT = {"arm64": "qemu-aarch64"}


def qemu_ready(arch: str) -> str | None:
    """None when this host runs ``arch`` programs (its own, or through qemu and binfmt_misc);
    else what is missing, as the fix to run."""
    machine = os.uname().machine
    if (arch, machine) in (("amd64", "x86_64"), ("arm64", "aarch64")):
        return None
    entry = QEMU_BINFMT.get(arch)
    if entry is None:
        return f"no emulator known for {arch}"
    binfmt = Path("/proc/sys/fs/binfmt_misc")
    if not (binfmt / "status").exists():
        return (
            "binfmt_misc is not mounted: `mount -t binfmt_misc binfmt_misc "
            "/proc/sys/fs/binfmt_misc` (as root)"
        )
    try:
        text = (binfmt / entry).read_text()
    except OSError:
        return (
            f"no {entry} entry in binfmt_misc: install Debian's qemu-user-static and "
            f"binfmt-support, then `update-binfmts --enable {entry}` (as root)"
        )
    if not text.startswith("enabled"):
        return f"binfmt_misc {entry} is disabled: `update-binfmts --enable {entry}` (as root)"
    return None


def _mmdebstrap(base: Base, lock: DebLock, repo_dir: Path, rootfs: Path, epoch: int) -> None:
    name, arch = lock.inputs.base, lock.inputs.architecture
    argv = [
        "mmdebstrap",
        f"--variant={base.variant}",
        f"--architectures={arch}",
        # Every locked package by name: the lock is the closure. (The variant alone would pick
        # Priority: required packages, a field a flat repository's index does not carry.)
        f"--include={','.join(sorted({d.name for d in lock.debs}))}",
        "--skip=output/dev",
        # Docs, man pages and locales are not needed in an image and only add bytes.
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        '--customize-hook=rm -f "$1"/etc/hostname "$1"/etc/resolv.conf',
        f"--customize-hook=printf '{SOURCES_NOTE.format(base=name)}' > \"$1\"/etc/apt/sources.list",
        f"--customize-hook=chroot \"$1\" dpkg-query -W -f '{INSTALLED_FORMAT}' > {shlex.quote(str(repo_dir.parent / 'installed.tsv'))}",
        base.suite,
        str(rootfs),
        f"deb [trusted=yes] copy://{repo_dir} ./",
    ]
    if os.geteuid() == 0:
        # As root, no network at all; as a user, mmdebstrap's own namespaces, and the only
        # source is the local folder anyway.
        argv = ["unshare", "--net", *argv]
    if missing := qemu_ready(arch):
        raise HaloError(f"base {name}: {arch} maintainer scripts need qemu: {missing}")
    say(f"base {name}: mmdebstrap {base.suite} offline from the store, SOURCE_DATE_EPOCH={epoch}")
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise HaloError(
            "mmdebstrap: not found; install Debian's mmdebstrap to make a base"
        ) from None
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:]
        raise HaloError(f"base {name}: mmdebstrap failed: {' | '.join(tail)}")
    _same_as_lock(name, lock, repo_dir.parent / "installed.tsv")


def _same_as_lock(name: str, lock: DebLock, installed: Path) -> None:
    """The made root holds exactly the lock's packages, or nothing is loaded."""
    got = {tuple(line.split("\t")) for line in installed.read_text().splitlines() if line}
    want = {(d.name, d.version, d.architecture) for d in lock.debs}
    if got != want:
        extra = sorted(f"{n} {v}" for n, v, _ in got - want)[:3]
        missing = sorted(f"{n} {v}" for n, v, _ in want - got)[:3]
        raise HaloError(
            f"base {name}: the made root differs from pins/debian.{name}.lock.toml: "
            f"not locked {extra or 'none'}, not installed {missing or 'none'}"
        )


def checked_lock(fetch: FetchDebs, repo: Path) -> DebLock:
    """The base's OS lock: the bytes the plan hashed, refused when it breaks an invariant or
    was locked for other inputs."""
    path = repo / fetch.lock
    if not path.is_file() or sha256_file(path) != fetch.lock_sha256:
        raise HaloError(f"{path}: changed since it was planned; plan and build again")
    lock = load_deb_lock(path)
    problems = check_deb_lock(lock, str(path), fetch.inputs)
    if problems:
        raise HaloError(
            problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
        )
    return lock


def make_rootfs(base: Base, lock: DebLock, store: object, out: Path, epoch: int) -> None:
    """The base's root filesystem tar at ``out``, from the store alone, for the lock's
    architecture."""
    with tempfile.TemporaryDirectory(prefix="halo-debs.") as tmp:
        # mmdebstrap's copy:// source: a folder the chroot can read (not file://).
        repo_dir = Path(tmp) / "repo"
        flat_repository(lock, store, repo_dir, epoch)
        _mmdebstrap(base, lock, repo_dir, out, epoch)


def make_base(
    node: MakeBase, fetch: FetchDebs, repo: Path, docker: Docker, workdir: Path
) -> BaseState:
    """Make (or find) a base on this machine: fetch its .debs (the only network step), then
    make it offline from the store."""
    state = base_state(node, docker)
    if state.image_id:
        say(f"base {fetch.inputs.base}: present ({state.ref}, {state.image_id[:19]})")
        return state
    docker.ping()  # "not here" must not be an engine that does not answer
    # Two builds of one run may need the same base at once: the first makes it, the second
    # waits and finds it (per engine).
    from halo.paths import cache_home, per_engine

    with exclusive(per_engine(cache_home() / "locks") / f"base-{fetch.inputs.base}.lock"):
        state = base_state(node, docker)
        if state.image_id:
            say(f"base {fetch.inputs.base}: present ({state.ref}, {state.image_id[:19]})")
            return state
        return _make(node, fetch, repo, docker, workdir)


def _make(node: MakeBase, fetch: FetchDebs, repo: Path, docker: Docker, workdir: Path) -> BaseState:
    from halo.paths import store_root
    from halo.store.store import Store

    base = node.base
    lock = checked_lock(fetch, repo)
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
            f" from {fetch.lock} (offline)",
            base.env,
            node.recipe,
            node.platform.deb_arch,
        )
        docker.load(archive)
        docker.tag(image_id, node.ref)
    say(f"base {fetch.inputs.base}: made {node.ref} ({image_id[:19]})")
    return BaseState(node.ref, image_id)
