"""Bases: made here in the fetch phase (mmdebstrap, or a Dockerfile over a digest-pinned image).

A made base is addressed by its recipe: its tag carries the recipe hash, its config carries it in
full (``BASE_LABEL``), and the recipe hash (not the image ID made here) is what every image and
derivation on it hashes (halo.images.inputs.base_identity): a plan is the same before and after
`halo image base`, and on a host with no engine. A made base counts as made only when its label
names the recipe in full, so a tag moved by hand or a 12-digit collision is made again.
"""

from __future__ import annotations

import io
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from halo.errors import HaloError
from halo.hashing import sha256_bytes, sha256_file, sha256_json
from halo.images.catalog import Base
from halo.images.docker import Docker
from halo.report import say

# Timestamps inside made bases (file mtimes via mmdebstrap, the image's `created`).
DEFAULT_EPOCH = 1793491200  # 2026-11-01T00:00:00Z
BASE_LABEL = "io.halo.base-recipe"  # the full recipe hash, in a made base's config


def source_date_epoch() -> int:
    return int(os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_EPOCH))


def recipe_hash(base: Base, repo: Path) -> str:
    definition: dict[str, object] = dict(base.definition)
    definition["mount_points"] = list(MOUNT_POINTS)
    if base.dockerfile:
        definition["dockerfile_sha256"] = sha256_file(repo / base.dockerfile)
    return sha256_json(definition)


def base_ref(base: Base, repo: Path) -> str:
    if base.recipe == "registry":
        return base.from_ref
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
    if base.recipe == "registry":  # pinned by digest: the reference is the content
        return BaseState(ref, docker.image_id(ref))
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


def base_archive(rootfs_tar: Path, out: Path, epoch: int, created_by: str, recipe: str = "") -> str:
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
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
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


def _mmdebstrap(base: Base, rootfs: Path, epoch: int) -> None:
    argv = [
        "mmdebstrap",
        f"--variant={base.variant}",
        f"--include={','.join(base.packages)}",
        "--skip=output/dev",
        # Docs, man pages and locales are not needed in an image and only add bytes.
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        '--customize-hook=rm -f "$1"/etc/hostname "$1"/etc/resolv.conf',
        base.suite,
        str(rootfs),
    ]
    say(
        f"base {base.name}: mmdebstrap {base.suite} ({', '.join(base.packages)}), SOURCE_DATE_EPOCH={epoch}"
    )
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise HaloError(
            "mmdebstrap: not found; install Debian's mmdebstrap to make the CPU base"
        ) from None
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:]
        raise HaloError(f"base {base.name}: mmdebstrap failed: {' | '.join(tail)}")


def make_base(base: Base, repo: Path, docker: Docker, workdir: Path) -> BaseState:
    """Make (or find) a base on this machine; the fetch phase, allowed to use the network."""
    state = base_state(base, repo, docker)
    if state.image_id:
        say(f"base {base.name}: present ({state.ref}, {state.image_id[:19]})")
        return state
    docker.ping()  # "not here" must not be an engine that does not answer
    if base.recipe == "registry":
        raise HaloError(
            f"base {base.name}: {base.from_ref} is not on this machine; `docker pull` it first"
        )
    epoch = source_date_epoch()
    workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        if base.recipe == "mmdebstrap":
            rootfs = Path(tmp) / "rootfs.tar"
            _mmdebstrap(base, rootfs, epoch)
            archive = Path(tmp) / "image.tar"
            image_id = base_archive(
                rootfs,
                archive,
                epoch,
                f"mmdebstrap --variant={base.variant} {base.suite} +{','.join(base.packages)}",
                recipe_hash(base, repo),
            )
            docker.load(archive)
            docker.tag(image_id, state.ref)
        else:
            say(f"base {base.name}: docker build {base.dockerfile} FROM {base.from_ref}")
            ctx = Path(tmp) / "context"
            for name in MOUNT_POINTS:  # the Dockerfile copies these to /
                target = ctx / "mount-points" / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.mkdir() if name.endswith("/") else target.write_bytes(b"")
            image_id = docker.build(
                context=ctx,
                dockerfile=repo / base.dockerfile,
                tags=[state.ref],
                build_args={
                    "FROM": base.from_ref,
                    "PYTHON": base.python,
                    "PACKAGES": " ".join(base.packages),
                    "SOURCE_DATE_EPOCH": str(epoch),
                },
                labels={
                    "org.opencontainers.image.base.name": base.from_ref,
                    BASE_LABEL: recipe_hash(base, repo),
                },
                network="host",
            )
    say(f"base {base.name}: made {state.ref} ({image_id[:19]})")
    return BaseState(state.ref, image_id)
