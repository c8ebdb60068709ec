"""The locked OS layer for real: resolve against Debian's archive, fetch .debs into a store,
make the base offline twice and get one image ID, refuse and re-fetch a tampered .deb.

Real mmdebstrap, apt-ftparchive and Docker; the archive is reached only to resolve and fetch.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from dockerd import PrivateEngine
from support import REPO, docker_or_skip

from halo.errors import HaloError
from halo.hashing import sha256_file
from halo.images.base import (
    base_archive,
    base_state,
    checked_lock,
    deb_inputs,
    fetch_debs,
    flat_repository,
    make_rootfs,
    source_date_epoch,
)
from halo.images.catalog import load_catalog
from halo.pins.deblock import check_deb_lock
from halo.store.store import Store

BASE = "debian12-python"


def _needs(*tools: str) -> None:
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(
                f"needs {tool} (Debian's {'apt-utils' if tool == 'apt-ftparchive' else tool})"
            )


@pytest.fixture(scope="module")
def base():  # type: ignore[no-untyped-def]
    return load_catalog(REPO).bases[BASE]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, base):  # type: ignore[no-untyped-def]
    """A fresh store holding the base's .debs, fetched from the configured Debian mirror."""
    store = Store(tmp_path_factory.mktemp("debstore"))
    fetch_debs(checked_lock(base, REPO), store)
    return store


@pytest.mark.network
def test_resolving_the_python_base_from_the_archive_gives_a_complete_closure(base) -> None:  # type: ignore[no-untyped-def]
    _needs("mmdebstrap")
    from halo.pins.debresolve import resolve
    from halo.sources import debian_mirror

    lock = resolve(deb_inputs(base), debian_mirror(base.suite))
    assert check_deb_lock(lock, BASE, deb_inputs(base)) == []
    python = next(d for d in lock.debs if d.name == "python3.11")
    assert python.version.startswith("3.11.")
    # The archive moves (point releases): the committed lock need not equal today's
    # resolution, only answer the same inputs.
    committed = checked_lock(base, REPO)
    assert committed.inputs == lock.inputs


def _tar_file(tar: Path, name: str) -> bytes:
    with tarfile.open(tar) as t:
        member = t.extractfile(name)
        assert member is not None
        return member.read()


@pytest.mark.network
@pytest.mark.docker
def test_the_base_made_twice_offline_from_the_store_is_one_image_id_in_two_engines(
    base, store: Store, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Made here from a fresh store, the base's rootfs is the same tar, byte for byte, as the
    one this recipe's base was made from before (in CI: build-cpu's, from its own store and work
    folder, in another process): its first layer's diff ID. Where no such base is on this
    engine, the test makes it twice itself. One make is minutes of CPU; the run needs one more."""
    _needs("mmdebstrap", "apt-ftparchive")
    docker = docker_or_skip()
    lock = checked_lock(base, REPO)
    epoch = source_date_epoch()
    made = base_state(base, REPO, docker)
    made_before = docker.inspect(made.ref, "{{index .RootFS.Layers 0}}") if made.image_id else None
    ids, tars = [], []
    for n in (1, 2) if made_before is None else (1,):
        # A different work folder each time: its path must not reach the bytes.
        work = tmp_path / f"make-{n}" / ("deep" * n)
        work.mkdir(parents=True)
        rootfs = work / "rootfs.tar"
        make_rootfs(base, lock, store, rootfs, epoch)
        ids.append(base_archive(rootfs, work / "image.tar", epoch, "test", base.env))
        tars.append(rootfs)
    if made_before is None:
        assert sha256_file(tars[0]) == sha256_file(tars[1])  # the same tar, byte for byte
        assert ids[0] == ids[1]
    else:
        assert "sha256:" + sha256_file(tars[0]) == made_before, f"{made.ref}'s rootfs differs"
    sources = _tar_file(tars[0], "./etc/apt/sources.list").decode()
    assert "copy:" not in sources and str(tmp_path) not in sources and "http" not in sources
    with tarfile.open(tars[0]) as t:
        names = t.getnames()
    assert not [n for n in names if "/var/lib/apt/lists/" in n and n.endswith("Packages")]
    # The first tar's image in the shared engine, the last one's in a private one: one ID.
    existed = docker.image_id(ids[0]) is not None  # made here before (halo image base): keep it
    assert ids[0] in docker.load(tars[0].parent / "image.tar")
    try:
        engine = PrivateEngine("osbase")
    except RuntimeError as exc:
        pytest.skip(f"needs a second Docker engine: {exc}")
    try:
        env = {**os.environ, **engine.env}
        proc = subprocess.run(
            [docker.exe, "load", "-i", str(tars[-1].parent / "image.tar")],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        got = subprocess.run(
            [docker.exe, "image", "inspect", "--format", "{{.Id}}", ids[0]],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert got.stdout.strip() == ids[0], got.stderr
    finally:
        engine.stop()
        if not existed:
            docker.remove(ids[0])


@pytest.mark.network
def test_a_tampered_deb_in_the_store_is_refused_then_fetched_again(base, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _needs("apt-ftparchive")
    full = checked_lock(base, REPO)
    small = sorted(full.debs, key=lambda d: d.size)[:3]
    lock = dataclasses.replace(full, debs=tuple(small))
    store = Store(tmp_path / "store")
    fetch_debs(lock, store)
    victim = store.path(small[0].sha256)
    victim.chmod(0o644)
    victim.write_bytes(victim.read_bytes()[:-1] + b"\0")  # one byte: same size, other bytes
    with pytest.raises(HaloError, match=re.escape(f"{small[0].file}: store entry corrupted")):
        flat_repository(lock, store, tmp_path / "repo", source_date_epoch())
    from halo.sources import debian_mirror, substitute_dirs
    from halo.store.debfetch import DebMirror, as_lock
    from halo.store.fetch import fetch_lock

    mirror = DebMirror.for_locks(debian_mirror(base.suite), [lock])
    origins = {
        r.artifact.file: r.origin
        for r in fetch_lock(as_lock(lock), store, mirror, substitute_dirs())
    }
    assert origins[small[0].file] == "repaired"
    assert {origins[d.file] for d in small[1:]} == {"store"}
    flat_repository(lock, store, tmp_path / "repo2", source_date_epoch())
    packages = (tmp_path / "repo2" / "Packages").read_text()
    assert f"SHA256: {small[0].sha256}" in packages


@pytest.mark.docker
def test_the_gpu_bases_env_is_in_the_image_config_and_not_the_cpu_base(tmp_path: Path) -> None:
    """`docker inspect` of anything FROM the GPU base shows the NVIDIA runtime's variables."""
    docker = docker_or_skip()
    catalog = load_catalog(REPO)
    empty = tmp_path / "rootfs.tar"
    with tarfile.open(empty, "w") as t:
        info = tarfile.TarInfo("etc")
        info.type = tarfile.DIRTYPE
        t.addfile(info, io.BytesIO(b""))
    seen = {}
    for name in ("debian12-gpu", BASE):
        out = tmp_path / f"{name}.tar"
        image_id = base_archive(empty, out, 0, "test", catalog.bases[name].env)
        assert image_id in docker.load(out)
        try:
            seen[name] = docker.inspect_json(image_id)["Config"]["Env"]
        finally:
            docker.remove(image_id)
    assert "NVIDIA_VISIBLE_DEVICES=all" in seen["debian12-gpu"]
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in seen["debian12-gpu"]
    assert any(
        e.startswith("LD_LIBRARY_PATH=") and "/usr/local/nvidia/lib64" in e
        for e in seen["debian12-gpu"]
    )
    assert not [e for e in seen[BASE] if e.startswith(("NVIDIA_", "LD_LIBRARY_PATH"))]
