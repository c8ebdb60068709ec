"""Bases: made here in the fetch phase (mmdebstrap, or a Dockerfile over a digest-pinned image).

A made base is content-addressed twice: its tag carries the hash of its recipe, and its image ID
(the sha256 of a config written without wall-clock time) becomes an input of every image on it.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
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


def source_date_epoch() -> int:
    return int(os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_EPOCH))


def recipe_hash(base: Base, repo: Path) -> str:
    definition: dict[str, object] = dict(base.definition)
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
    ref = base_ref(base, repo)
    return BaseState(ref, docker.image_id(ref) if docker else None)


def docker_archive(rootfs_tar: Path, out: Path, epoch: int, created_by: str) -> None:
    """Wrap a rootfs tarball as a one-layer image archive for `docker load`, deterministically."""
    diff_id = "sha256:" + sha256_file(rootfs_tar)
    created = _iso(epoch)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Cmd": ["/bin/bash"],
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": created_by}],
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    # Docker derives the image ID from exactly these bytes, so it is known before loading.
    config_name = sha256_bytes(config_bytes) + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": None, "Layers": [layer_name]}]
    ).encode()
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in ((config_name, config_bytes), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), epoch, 0o644
            tar.addfile(info, io.BytesIO(data))
        info = tar.gettarinfo(str(rootfs_tar), arcname=layer_name)
        info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = (
            epoch,
            0,
            0,
            "",
            "",
            0o644,
        )
        with rootfs_tar.open("rb") as fh:
            tar.addfile(info, fh)


def _iso(epoch: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
            docker_archive(
                rootfs,
                archive,
                epoch,
                f"mmdebstrap --variant={base.variant} {base.suite} +{','.join(base.packages)}",
            )
            docker.load(archive)
            image_id = _loaded_id(archive)
            docker.tag(image_id, state.ref)
        else:
            say(f"base {base.name}: docker build {base.dockerfile} FROM {base.from_ref}")
            image_id = docker.build(
                context=Path(tmp),
                dockerfile=repo / base.dockerfile,
                tags=[state.ref],
                build_args={
                    "FROM": base.from_ref,
                    "PYTHON": base.python,
                    "PACKAGES": " ".join(base.packages),
                    "SOURCE_DATE_EPOCH": str(epoch),
                },
                labels={"org.opencontainers.image.base.name": base.from_ref},
                network="host",
            )
    say(f"base {base.name}: made {state.ref} ({image_id[:19]})")
    return BaseState(state.ref, image_id)


def _loaded_id(archive: Path) -> str:
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
    return "sha256:" + manifest[0]["Config"].removesuffix(".json")
