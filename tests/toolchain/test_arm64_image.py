"""The arm64 halo:cpu, built on this amd64 host and run here under qemu.

`halo image build cpu --platform linux/arm64` makes the arm64 base (mmdebstrap; qemu runs only
the packages' maintainer scripts) and assembles the image (uv installs for aarch64; nothing
runs under emulation), tagged halo:cpu-arm64 and halo:cpu-<input hash>. Then the image runs:
its interpreter, torch, and the tiny SFT example for a few steps, whose losses must equal the
amd64 image's within LOSS_TOLERANCE. Needs a Docker engine, and qemu-user-static registered
with binfmt_misc for arm64 programs; in CI a missing one fails instead of skipping.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support import REPO, built_ref, docker_or_skip, halo

from halo.images.docker import Docker
from halo.images.realise.base import qemu_ready
from halo.pins.lockfile import load_lock
from halo.testing.container import BYTECODE_ENV, PYCACHE, in_ci

pytestmark = [pytest.mark.docker, pytest.mark.arm64, pytest.mark.xdist_group("arm64")]

STEPS = 3
# Two sequences a step, not the example's eight: qemu computes floating point in software, about
# 0.1 GFLOP/s here, and one step of eight took 22 s of the test's minutes. Both images run the
# same flags, so their losses still compare step by step.
BATCH = 2
# The same model, data, seed and steps: losses differ only by how each CPU rounds (x86's AVX
# and Arm's NEON kernels sum in other orders), about 1e-6 relative per step measured here;
# 1e-4 relative leaves room and still catches a wrong token, batch or learning rate.
LOSS_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def docker() -> Docker:
    engine = docker_or_skip()
    if (missing := qemu_ready("arm64")) is not None:
        (pytest.fail if in_ci() else pytest.skip)(f"arm64 programs cannot run here: {missing}")
    return engine


@pytest.fixture(scope="module")
def bytecode(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """`docker run` flags that keep the arm64 containers' bytecode in one folder of the module.

    The image ships none, and under qemu each container compiled torch's sources again on
    import (measured: `import torch` 31 s, the tiny SFT 182 -> 160 s with it compiled once).
    """
    folder = tmp_path_factory.mktemp("pycache-arm64")
    folder.chmod(0o777)  # for whichever user the image runs as
    env = [a for k, v in BYTECODE_ENV.items() for a in ("-e", f"{k}={v}")]
    return [*env, "-v", f"{folder}:{PYCACHE}"]


@pytest.fixture(scope="module")
def arm64_ref(docker: Docker) -> str:
    """The checkout's arm64 halo:cpu, by its immutable tag (a no-op when built already)."""
    proc = halo("image", "build", "cpu", "--platform", "linux/arm64", cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return built_ref(proc.stdout, image="cpu-arm64")  # halo:cpu-<its input hash>


def test_the_image_is_arm64_and_runs_its_stack_under_qemu(
    arm64_ref: str, docker: Docker, bytecode: list[str]
) -> None:
    info = docker.inspect_json(arm64_ref)
    assert (info["Os"], info["Architecture"]) == ("linux", "arm64")
    proc = docker.run(
        ["--rm", "--network", "none", *bytecode, arm64_ref, "python", "-c",
         "import platform, sys, torch, halo; print(platform.machine(), sys.prefix, "
         "torch.__version__, torch.get_num_threads() > 0)"],
        capture=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    machine, prefix, torch_version, threads = proc.stdout.split()
    assert (machine, prefix, threads) == ("aarch64", "/opt/venv", "True")
    # The lock's torch: PyPI's aarch64 wheel carries its CUDA in a local label (2.11.0+cu130),
    # the x86_64 one none; the public version is the one the platforms share.
    locked = next(p.version for p in load_lock(REPO / "pins" / "pylock.cpu-arm64.toml").packages
                  if p.name == "torch")  # fmt: skip
    assert torch_version.split("+")[0] == str(locked), torch_version
    build = docker.run(
        ["--rm", "--network", "none", arm64_ref, "cat", "/etc/halo/build.json"], True
    )
    record = json.loads(build.stdout)
    assert record["inputs"]["platform"] == "linux/arm64"
    assert arm64_ref.endswith(record["input_hash"][:12])


def test_an_unchanged_rebuild_is_a_no_op(arm64_ref: str) -> None:
    start = time.monotonic()
    proc = halo("image", "build", "cpu", "--platform", "linux/arm64", cwd=REPO)
    seconds = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "halo:cpu-arm64: up to date (input hash " in proc.stdout
    assert "assemble" not in proc.stderr and "mmdebstrap" not in proc.stderr
    assert seconds < 10, f"a no-op took {seconds:.1f}s"


def _losses(docker: Docker, ref: str, out: Path, flags: list[str]) -> list[float]:
    """The tiny SFT example for STEPS steps in ``ref``; its loss at each step."""
    out.mkdir(parents=True)
    proc = docker.run(
        [
            "--rm", "--network", "none", "-e", "HF_HUB_OFFLINE=1", "-e", "OMP_NUM_THREADS=1",
            *flags,
            "-v", f"{REPO}:/workspace:ro", "-v", f"{out}:/out", ref,
            "halo", "launch", "sft", "examples/sft/config.yaml", "--",
            "--runtime.paths.checkpoints=/out/checkpoints", "--runtime.paths.logs=/out/logs",
            f"--training.max_steps={STEPS}", f"--training.global_batch_size={BATCH}",
            "--checkpoint.resume=false",
        ],
        capture=True,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (metrics,) = out.glob("logs/**/metrics.jsonl")
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    return [float(r["loss"]) for r in rows if "loss" in r]


def test_tiny_sft_under_qemu_matches_the_amd64_image(
    arm64_ref: str, docker: Docker, bytecode: list[str], tmp_path: Path
) -> None:
    amd = halo("image", "build", "cpu", cwd=REPO)  # a no-op when CI's build-cpu ran first
    assert amd.returncode == 0, amd.stderr[-2000:]
    amd64_ref = built_ref(amd.stdout)
    arm = _losses(docker, arm64_ref, tmp_path / "arm64", bytecode)
    ref = _losses(docker, amd64_ref, tmp_path / "amd64", [])
    print("amd64 losses:", ref, "\narm64 losses:", arm)
    assert len(arm) == len(ref) == STEPS
    for step, (a, b) in enumerate(zip(arm, ref, strict=True), 1):
        assert abs(a - b) <= LOSS_TOLERANCE * max(1.0, abs(b)), f"step {step}: {a} vs {b}"
