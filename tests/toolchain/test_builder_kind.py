"""The builder kind comes from configuration alone, and a plan works on any host.

`halo image plan` for the CUDA images runs here as a user with nothing: no HALO_* variables,
no python3.12 (no Python at all) on PATH, not root, no Docker; and it gives the same input
hash as on a host whose engine has the bases made.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import REPO, docker_or_skip, halo

from halo.builder.kind import builder_kind
from halo.errors import HaloError
from halo.images.base import BASE_LABEL, base_state, recipe_hash
from halo.images.catalog import load_catalog

IMAGES = ("blackwell", "hopper")
NOBODY = 65534


def test_docker_unless_native_is_asked_for() -> None:
    assert builder_kind({}) == "docker"
    assert builder_kind({"HALO_BUILDER": ""}) == "docker"
    assert builder_kind({"HALO_BUILDER": "native"}) == "native"
    with pytest.raises(HaloError, match=r"\$HALO_BUILDER: 'podman': expected one of docker, nat"):
        builder_kind({"HALO_BUILDER": "podman"})


def test_a_bad_builder_kind_is_one_line_exit_2() -> None:
    proc = halo("image", "plan", "blackwell", cwd=REPO, env={"HALO_BUILDER": "chroot"})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "halo: error: $HALO_BUILDER: 'chroot': expected one of docker, native"
    ]


def _bare_env(home: Path, path: Path, pythonpath: str) -> dict[str, str]:
    """Only what a shell of a new user has: no HALO_*, PATH without any Python."""
    return {"HOME": str(home), "PATH": str(path), "LANG": "C.UTF-8", "PYTHONPATH": pythonpath}


@pytest.fixture
def world() -> Iterator[Path]:
    """A folder any user may enter (pytest's tmp_path is its owner's only)."""
    d = Path(tempfile.mkdtemp(prefix="halo-builder-kind-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _world_dir(parent: Path, name: str) -> Path:
    d = parent / name
    d.mkdir()
    d.chmod(0o777)  # the plan runs as nobody: it writes its catalog memo under HOME
    return d


def _as_nobody() -> tuple[list[str], str] | None:
    """(argv prefix, PYTHONPATH) that runs halo from this checkout as an unprivileged user:
    this interpreter if nobody may run it, else Debian's python3 with this venv's packages."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        return None
    drop = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    purelib = sysconfig.get_paths()["purelib"]
    for python, path in ((sys.executable, str(REPO)), ("/usr/bin/python3", f"{REPO}:{purelib}")):
        probe = subprocess.run(
            [*drop, python, "-c", "import halo.cli, pydantic, yaml"],
            env={"PATH": "/nonexistent", "PYTHONPATH": path, "HOME": "/"},
            capture_output=True,
            check=False,
        )
        if probe.returncode == 0:
            return [*drop, python], path
    return None


def _plans(argv: list[str], env: dict[str, str]) -> dict[str, dict]:  # type: ignore[type-arg]
    proc = subprocess.run(
        [*argv, "-m", "halo", "image", "plan", "--json", *IMAGES],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return {p["image"]: p for p in json.loads(proc.stdout)}


def _summary(plans: dict[str, dict]) -> dict[str, object]:  # type: ignore[type-arg]
    return {
        name: (p["input_hash"], [(d["name"], d["hash"], d["toolchain"]) for d in p["derivations"]])
        for name, p in plans.items()
    }


def _labelled_stand_in(docker, ref: str, recipe: str, tmp: Path) -> None:  # type: ignore[no-untyped-def]
    """An empty image tagged and labelled as the made base: what the plan can see of one."""
    empty = tmp / "empty.tar"
    if not empty.exists():
        tarfile.open(empty, "w").close()
    subprocess.run(
        [docker.exe, "import", "--change", f"LABEL {BASE_LABEL}={recipe}", str(empty), ref],
        capture_output=True,
        check=True,
    )


@pytest.mark.xdist_group(
    "base-tags"
)  # one worker: side by side, one tagged a stand-in as the other
# expected another recipe under the same tag (CI, two workers)
def test_plan_needs_no_python_root_docker_or_halo_vars_and_making_bases_changes_no_hash(
    world: Path,
) -> None:
    home = _world_dir(world, "home")
    nothing = _world_dir(world, "bin")  # an empty PATH: no python3.12, no docker
    nobody = _as_nobody()
    if nobody is None:
        argv, pythonpath = [sys.executable], str(REPO)
        who = "this user"
    else:
        (argv, pythonpath), who = nobody, "nobody"
    bare = _summary(_plans(argv, _bare_env(home, nothing, pythonpath)))
    for name in IMAGES:
        kinds = {tc.split()[0] for _, _, tc in bare[name][1]}  # type: ignore[index]
        assert kinds == {"docker"}, (who, name, kinds)

    # The same checkout on a host whose engine has every base of these images made.
    docker = docker_or_skip()
    catalog = load_catalog(REPO)
    bases = {b for i in IMAGES for b in (catalog.image(i).base, catalog.image(i).builder) if b}
    made_here: list[str] = []
    try:
        for name in sorted(bases):
            base = catalog.bases[name]
            state = base_state(base, REPO, docker)
            if state.image_id is None:
                _labelled_stand_in(docker, state.ref, recipe_hash(base, REPO), world)
                made_here.append(state.ref)
            assert base_state(base, REPO, docker).image_id
        with_docker = _world_dir(world, "docker-bin")
        (with_docker / "docker").symlink_to(docker.builder.exe)
        env = _bare_env(_world_dir(world, "home2"), with_docker, str(REPO))
        plans = _plans([sys.executable], env)
    finally:
        for ref in made_here:
            subprocess.run([docker.exe, "rmi", ref], capture_output=True, check=False)
    assert all(s["image_id"] for p in plans.values() for s in p["stages"])  # seen as made
    assert _summary(plans) == bare


def test_native_is_explicit_and_asks_for_the_locks_interpreter(world: Path) -> None:
    """HALO_BUILDER=native still builds on the host: it needs the lock's CPython there."""
    env = _bare_env(_world_dir(world, "home"), _world_dir(world, "bin"), str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "halo", "image", "plan", "blackwell"],
        cwd=REPO,
        env={**env, "HALO_BUILDER": "native"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert re.match(r"halo: error: no CPython 3\.\d+ found", proc.stderr), proc.stderr


@pytest.mark.xdist_group("base-tags")  # see above
def test_a_base_counts_as_made_only_with_its_recipe_and_realise_refuses_without_it(
    world: Path,
) -> None:
    """A tag moved by hand (an image without the recipe hash) is not the base; compiling on
    the docker builder then stops before fetching anything, with the command that makes it."""
    from halo.images.derivations import image_derivations, realise
    from halo.images.derivations import realiser as make_realiser
    from halo.store.store import Store

    docker = docker_or_skip()
    catalog = load_catalog(REPO)
    image = catalog.image("blackwell")
    base = catalog.bases[image.builder or image.base]
    state = base_state(base, REPO, None)
    if docker.image_id(state.ref):
        pytest.skip(f"{state.ref} is made in this engine: a shared tag is not moved by a test")
    (drv, *_) = image_derivations(REPO, catalog, image)
    r = make_realiser(REPO, Store(world / "store"), docker, None)
    try:
        _labelled_stand_in(docker, state.ref, "0" * 64, world)  # someone else's recipe
        assert base_state(base, REPO, docker).image_id is None
        with pytest.raises(HaloError, match=r"builder base .* is not made here .*halo image base"):
            realise(drv, r)
        assert not (world / "store").exists() or not any((world / "store").rglob("*.tar.gz"))
        _labelled_stand_in(docker, state.ref, recipe_hash(base, REPO), world)
        assert base_state(base, REPO, docker).image_id == docker.image_id(state.ref)
    finally:
        subprocess.run([docker.exe, "rmi", state.ref], capture_output=True, check=False)
