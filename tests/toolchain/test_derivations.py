"""Source builds as derivations: hashed by their inputs, built offline, compiled once.

Real builds only: a C extension and a tiny CUDA extension made in the test, compiled by
toolchains installed from the locks (the CUDA one is the cuda-builder set's nvcc, for one
architecture), natively in network-less namespaces or in Docker.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from kernels_support import (  # noqa: F401 - *_fixture: fixtures used by name
    DEMO_C,
    DEMO_CUDA,
    SMALL,
    cuda_native_fixture,
    derivation,
    fetched_or_skip,
    pin_for,
    realiser,
    small_native_fixture,
    store_with,
    write_tree,
)
from support import REPO, docker_or_skip, halo

from halo.builder.native import FIXED
from halo.builder.toolchain import Toolchain, docker_toolchain
from halo.errors import HaloError
from halo.images.base import make_base, recipe_hash
from halo.images.catalog import load_catalog
from halo.images.derivations import (
    Derivation,
    arch_env,
    build_jobs,
    derivation_hash,
    image_derivations,
    realise,
)
from halo.images.inputs import base_identity
from halo.pins.lockfile import Artifact, load_lock
from halo.pins.source_pins import Submodule

GIB = 1 << 30
FAKE_TC = Toolchain(
    kind="native",
    requirements=(("pip", "26.3", Artifact("wheels/pip-26.3-py3-none-any.whl", "a" * 64, 1)),),
    python="python3",
    host=(("python", "cpython 3.12 cpython-312-x86_64-linux-gnu"), ("libc", "glibc 2.36")),
)


def test_build_jobs_fit_memory_not_just_cores() -> None:
    assert build_jobs(cores=64, mem_bytes=32 * GIB) == (4, 2)  # 4 GiB per nvcc thread
    assert build_jobs(cores=2, mem_bytes=24 * GIB) == (2, 1)
    assert build_jobs(cores=8, mem_bytes=2 * GIB) == (1, 1)


# --- the derivation hash -----------------------------------------------------------------------


def test_hash_covers_source_submodules_toolchain_env_patches_and_recipe() -> None:
    pin = pin_for(DEMO_C, "demo-ext", "halo-demo-ext")
    base = Derivation(pin, FAKE_TC, (("TORCH_CUDA_ARCH_LIST", "9.0"),), ())
    h = derivation_hash(base, REPO)
    changed = {
        "source": dataclasses.replace(base, pin=dataclasses.replace(pin, content_sha256="f" * 64)),
        "submodule": dataclasses.replace(
            base,
            pin=dataclasses.replace(
                pin, submodules=(Submodule("third/x", "r", "0" * 40, "e" * 64),)
            ),
        ),
        "subdirectory": dataclasses.replace(base, pin=dataclasses.replace(pin, subdirectory="py")),
        "version": dataclasses.replace(base, pin=dataclasses.replace(pin, version="1.0.1")),
        "interpreter": dataclasses.replace(
            base,
            toolchain=dataclasses.replace(
                FAKE_TC, host=(("python", "cpython 3.11 cpython-311-x86_64-linux-gnu"),)
            ),
        ),
        "wheels": dataclasses.replace(
            base,
            toolchain=dataclasses.replace(
                FAKE_TC,
                requirements=(("pip", "26.3", Artifact("wheels/pip.whl", "b" * 64, 1)),),
            ),
        ),
        "env": dataclasses.replace(base, env=(("TORCH_CUDA_ARCH_LIST", "10.0"),)),
        "patches": dataclasses.replace(base, patches=(("some-patch", "c" * 64),)),
        "kind": dataclasses.replace(base, toolchain=dataclasses.replace(FAKE_TC, kind="docker")),
    }
    hashes = {what: derivation_hash(d, REPO) for what, d in changed.items()}
    assert all(v != h for v in hashes.values()), hashes
    assert len(set(hashes.values())) == len(hashes)  # and each one differently
    assert derivation_hash(base, REPO) == h  # the same inputs, the same hash
    # The interpreter's path is where it lives, not what it is: not an input.
    moved = dataclasses.replace(base, toolchain=dataclasses.replace(FAKE_TC, python="/x/python"))
    assert derivation_hash(moved, REPO) == h


def _image_hashes(repo: Path) -> dict[tuple[str, str], str]:
    catalog = load_catalog(repo)
    return {
        (image.name, d.name): derivation_hash(d, repo)
        for image in catalog.images.values()
        for d in image_derivations(repo, catalog, image)
    }


def test_max_jobs_changes_no_hash_and_a_pin_may_not_name_it(
    monkeypatch: pytest.MonkeyPatch, repo_copy: Path
) -> None:
    before = _image_hashes(REPO)
    assert {k[1] for k in before} == {"flash-attn", "flash-attn-3", "deep-ep"}
    monkeypatch.setenv("MAX_JOBS", "1")
    monkeypatch.setenv("NVCC_THREADS", "7")
    assert _image_hashes(REPO) == before
    monkeypatch.setenv("MAX_JOBS", "64")
    assert _image_hashes(REPO) == before

    sources = repo_copy / "pins" / "sources.toml"
    text = sources.read_text()
    sources.write_text(text.replace("env = {}", 'env = { MAX_JOBS = "8" }', 1))
    proc = halo("image", "plan", "blackwell", cwd=repo_copy)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "halo: error: pins/sources.toml: source.deep-ep.env.MAX_JOBS: parallelism is set from "
        "the building host (never an input of the derivation); remove it"
    ]


def test_changing_the_arch_list_changes_the_hash(repo_copy: Path) -> None:
    before = _image_hashes(repo_copy)
    catalog = repo_copy / "images" / "images.yaml"
    catalog.write_text(catalog.read_text().replace('cuda_arch: ["10.0"]', 'cuda_arch: ["12.0"]'))
    after = _image_hashes(repo_copy)
    assert after[("blackwell", "flash-attn")] != before[("blackwell", "flash-attn")]
    assert after[("hopper", "flash-attn")] == before[("hopper", "flash-attn")]
    # DeepEP names its own architectures per set (sources.toml), so the catalog's do not move it.
    assert after[("blackwell", "deep-ep")] == before[("blackwell", "deep-ep")]
    sources = repo_copy / "pins" / "sources.toml"
    sources.write_text(sources.read_text().replace('blackwell = "10.0"', 'blackwell = "10.3"'))
    assert _image_hashes(repo_copy)[("blackwell", "deep-ep")] != before[("blackwell", "deep-ep")]


def test_one_architecture_per_image_for_flash_attention() -> None:
    catalog = load_catalog(REPO)
    envs = {
        (image.name, d.name): dict(d.env)
        for image in (catalog.image("blackwell"), catalog.image("hopper"))
        for d in image_derivations(REPO, catalog, image)
    }
    assert envs[("blackwell", "flash-attn")]["FLASH_ATTN_CUDA_ARCHS"] == "100"
    assert envs[("hopper", "flash-attn")]["FLASH_ATTN_CUDA_ARCHS"] == "90"
    assert envs[("hopper", "flash-attn-3")]["TORCH_CUDA_ARCH_LIST"] == "9.0a"
    assert envs[("hopper", "deep-ep")]["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert all("MAX_JOBS" not in env for env in envs.values())


def test_arch_env_speaks_each_build_systems_form() -> None:
    assert arch_env(["9.0a"]) == {"TORCH_CUDA_ARCH_LIST": "9.0a", "FLASH_ATTN_CUDA_ARCHS": "90"}
    assert arch_env(["9.0", "10.0"])["FLASH_ATTN_CUDA_ARCHS"] == "90;100"
    with pytest.raises(HaloError, match="at least one architecture"):
        arch_env([])


# --- builds ------------------------------------------------------------------------------------


def _run_ext(site: Path, code: str, python: str = sys.executable) -> str:
    proc = subprocess.run(
        [python, "-c", code],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_c_extension_compiles_natively_offline_once_then_is_reused(
    tmp_path: Path, small_native: Toolchain
) -> None:
    tc = small_native
    pin = pin_for(DEMO_C, "demo-ext", "halo-demo-ext")
    store = store_with(tmp_path / "store", tc, pin, DEMO_C)
    drv = derivation(pin, tc, DEMO_GREETING="hi")
    r = realiser(tmp_path, store)

    first = realise(drv, r)
    second = realise(drv, r)
    assert (first.origin, second.origin) == ("built", "store")
    assert (first.hash, first.sha256) == (second.hash, second.sha256)
    with zipfile.ZipFile(first.wheel) as zf:
        assert any(n.endswith(".so") for n in zf.namelist())
        zf.extractall(tmp_path / "site")
    assert (
        _run_ext(tmp_path / "site", "import halo_demo_ext; print(halo_demo_ext.greet(7))")
        == "hi 49"
    )


def test_a_build_that_runs_git_or_reaches_the_network_fails_by_name(
    tmp_path: Path, small_native: Toolchain
) -> None:
    """The network namespace: even a server on this host's loopback is out of reach."""
    server = socket.create_server(("127.0.0.1", 0))  # listening: the kernel would accept
    port = server.getsockname()[1]
    tc = small_native
    reach = write_tree(
        tmp_path / "reach",
        {
            "setup.py": f"""
                import socket
                from setuptools import setup
                socket.create_connection(("127.0.0.1", {port}), timeout=5).close()
                setup(name="halo-reach", version="1.0.0")
                """,
        },
    )
    pin = pin_for(reach, "reach", "halo-reach")
    r = realiser(tmp_path, store_with(tmp_path / "store", tc, pin, reach))
    with pytest.raises(
        HaloError, match=r"derivation reach: pip wheel exited 1: .*(refused|unreachable)"
    ):
        realise(derivation(pin, tc), r)
    server.close()

    git = write_tree(
        tmp_path / "git",
        {
            "setup.py": """
                import subprocess
                from setuptools import setup
                subprocess.run(["git", "rev-parse", "HEAD"], check=False)
                setup(name="halo-git", version="1.0.0")
                """,
        },
    )
    pin = pin_for(git, "git", "halo-git")
    r = realiser(tmp_path, store_with(tmp_path / "store2", tc, pin, git))
    with pytest.raises(HaloError) as err:
        realise(derivation(pin, tc), r)
    assert err.value.message == (
        "derivation git: its build ran `git rev-parse HEAD` (offline builds from pinned archives "
        "do not; patch the build script in patches/sources/)"
    )


def test_the_wheel_must_be_the_pinned_distribution_and_version(
    tmp_path: Path, small_native: Toolchain
) -> None:
    tc = small_native
    pin = pin_for(DEMO_C, "demo-ext", "halo-demo-ext", version="1.0.0+local")
    r = realiser(tmp_path, store_with(tmp_path / "store", tc, pin, DEMO_C))
    with pytest.raises(HaloError) as err:
        realise(derivation(pin, tc), r)
    assert err.value.message == (
        "derivation demo-ext: the build made halo-demo-ext 1.0.0, the pin says "
        "halo-demo-ext 1.0.0+local (pins/sources.toml)"
    )
    assert not list(r.store.root.glob("derivations/*.json"))  # nothing recorded


def test_tiny_cuda_extension_with_the_locked_nvcc_for_one_arch(
    tmp_path: Path, cuda_native: Toolchain
) -> None:
    """The cuda-builder lock's nvcc and headers, assembled into a CUDA_HOME that torch's
    cpp_extension accepts, compile device code for exactly the image's architecture."""
    tc = cuda_native
    pin = pin_for(DEMO_CUDA, "demo-cuda-ext", "halo-demo-cuda-ext")
    store = store_with(tmp_path / "store", tc, pin, DEMO_CUDA)
    drv = derivation(pin, tc, image="hopper")  # 9.0a, from images.yaml
    r = realiser(tmp_path, store)

    first = realise(drv, r)
    second = realise(drv, r)
    assert (first.origin, second.origin) == ("built", "store")
    with zipfile.ZipFile(first.wheel) as zf:
        zf.extractall(tmp_path / "site")
        blob = b"".join(zf.read(n) for n in zf.namelist() if n.endswith(".so"))
    # Nothing of this host's layout in the binary: the build ran at fixed paths.
    assert str(tmp_path).encode() not in blob and str(FIXED).encode() in blob
    # Import with the builder's torch loaded (it brings libcudart); no GPU here, so the device
    # query fails with a CUDA error code, which proves libcudart is linked and loads.
    from halo.builder.toolchain import builder_key, builders_root

    python = str(builders_root() / builder_key(tc)[:16] / "bin" / "python")
    out = _run_ext(
        tmp_path / "site",
        "import torch, halo_demo_cuda as m; print(m.arch_list(), m.device_status())",
        python,
    )
    arches, status = out.splitlines()[-1].split()
    assert arches == "900" and int(status) != 0


@pytest.mark.docker
def test_c_extension_compiles_in_docker_once_then_is_reused(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    docker = docker_or_skip()
    fetched_or_skip("cpu")
    catalog = load_catalog(REPO)
    base = catalog.bases["debian12-build"]
    builder = make_base(base, REPO, docker, tmp_path / "work")
    assert builder.image_id
    lock = load_lock(REPO / "pins" / "pylock.cpu.toml")
    identity = base_identity(builder, recipe_hash(base, REPO))  # as toolchain_for names it
    tc = docker_toolchain(lock, "python3", builder.ref, identity, SMALL)
    pin = pin_for(DEMO_C, "demo-ext", "halo-demo-ext")
    store = store_with(tmp_path / "store", tc, pin, DEMO_C)
    drv = Derivation(pin, tc, (("DEMO_GREETING", "hi"),), ())
    r = realiser(tmp_path, store, docker=docker)

    first = realise(drv, r)
    second = realise(drv, r)
    assert (first.origin, second.origin) == ("built", "store")
    with zipfile.ZipFile(first.wheel) as zf:
        zf.extractall(tmp_path / "site")
    assert (
        _run_ext(tmp_path / "site", "import halo_demo_ext; print(halo_demo_ext.greet(7))")
        == "hi 49"
    )

    # Another derivation on the same toolchain, built with other parallelism: its own compile,
    # but the toolchain's layer (3 GB for the kernels' builder) is the first's, not installed again.
    # (NVCC_THREADS, which a C extension ignores: a value no earlier build of this engine had.)
    monkeypatch.setenv("NVCC_THREADS", str(secrets.randbelow(10**6) + 2))
    capfd.readouterr()
    other = realise(Derivation(pin, tc, (("DEMO_GREETING", "ho"),), ()), r)
    log = "".join(capfd.readouterr())
    assert other.origin == "built" and other.hash != first.hash
    step = re.search(r"^#(\d+) \[build 2/\d\] RUN --mount=type=bind,source=wheels", log, re.M)
    assert step is not None, log[-3000:]
    assert re.search(rf"^#{step[1]} CACHED$", log, re.M), log[-3000:]


def test_stopping_halo_stops_the_build(tmp_path: Path, small_native: Toolchain) -> None:
    """SIGTERM to halo reaches the build, which runs in its own session."""
    started = tmp_path / "build.pid"
    slow = write_tree(
        tmp_path / "slow",
        {
            "setup.py": f"""
                import os, time
                from setuptools import setup
                with open({str(started)!r}, "w") as fh:
                    fh.write(str(os.getpid()))
                time.sleep(600)
                setup(name="halo-slow", version="1.0.0")
                """,
        },
    )
    pin = pin_for(slow, "slow", "halo-slow")
    store_with(tmp_path / "store", small_native, pin, slow)
    script = (
        "import sys; from pathlib import Path; import kernels_support as k\n"
        "from halo.images.derivations import realise\n"
        "from halo.store.store import Store\n"
        f"pin = k.pin_for(Path({str(slow)!r}), 'slow', 'halo-slow')\n"
        f"r = k.realiser(Path({str(tmp_path)!r}), Store(Path({str(tmp_path / 'store')!r})))\n"
        "realise(k.derivation(pin, k.small_toolchain()), r)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'tests' / 'toolchain'}:{REPO}"}
    halo_proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    deadline = time.monotonic() + 300
    while not started.exists() or not started.read_text():
        assert halo_proc.poll() is None and time.monotonic() < deadline, "the build never started"
        time.sleep(0.5)
    build = int(started.read_text())
    halo_proc.send_signal(signal.SIGTERM)
    assert halo_proc.wait(timeout=60) != 0
    deadline = time.monotonic() + 30
    while _running(build) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _running(build), "the build script outlived halo"


def _running(pid: int) -> bool:
    """Alive and not a zombie (a dead child waits for PID 1, which reaps when it likes)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
