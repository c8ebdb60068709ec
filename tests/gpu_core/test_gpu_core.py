"""The pull-request GPU gate: one GPU, the image's own CUDA 13 stack, the trainer in bf16.

Every test compares against a reference: attention kernels (forward and backward) against
fp32 SDPA, the bf16 step against the fp32 step, a resumed run against an uninterrupted one,
GRPO/DPO steps on the GPU against the same step on the CPU, versions against the lock.
The comparison logic is halo.train.measure.numerics, itself tested on the CPU (tests/cpu/test_numerics.py).

Run inside the image (`nox -s test-gpu-core`), natively (`halo test gpu-core --native`) or on
a lent GPU machine (`nox -s device-check`, docs/gpu.md). Without a GPU every test here is
skipped with the reason (tests/conftest.py), never passed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cpu.conftest import EXAMPLES, REPO, metrics, outputs, run_halo, train_here

from halo.train.models import attention

try:
    from halo.train.measure import numerics as nm

    CASES: tuple[Any, ...] = nm.CASES
except ImportError:  # no torch: tests/conftest.py skips every test here with that reason
    CASES = ()

pytestmark = pytest.mark.gpu_core

BUILD_RECORD = Path("/etc/halo/build.json")


def _torch():  # type: ignore[no-untyped-def]
    import torch

    return torch


def test_torch_is_the_cuda13_build() -> None:
    torch = _torch()
    assert torch.version.cuda is not None and torch.version.cuda.startswith("13."), (
        torch.version.cuda
    )
    assert torch.cuda.is_available()
    x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(
        (x @ x.T).float().cpu(), x.float().cpu() @ x.float().cpu().T, atol=2.0, rtol=2e-2
    )


def _image_lock() -> Any:
    if not BUILD_RECORD.is_file():
        pytest.skip(
            "needs an image's /etc/halo/build.json to know its pin set (running natively, "
            "outside an image: the host's own torch/NCCL/CUDA are not the lock's to check)"
        )
    from halo.images.catalog import load_catalog
    from halo.pins.lockfile import load_lock, lock_path

    image = json.loads(BUILD_RECORD.read_text())["image"]
    return load_lock(lock_path(REPO / "pins", load_catalog(REPO).image(image).pins))


def _pinned(lock: Any, name: str) -> str:
    pkg = lock.package(name)
    assert pkg is not None, f"{name} is not in the image's lock"
    return str(pkg.version)


def test_nccl_is_the_locked_version() -> None:
    lock = _image_lock()
    major, minor, patch = _torch().cuda.nccl.version()
    assert f"{major}.{minor}.{patch}" == _pinned(lock, "nvidia-nccl-cu13")


def test_torch_and_cuda_are_the_locked_versions() -> None:
    lock = _image_lock()
    torch = _torch()
    assert torch.__version__.split("+")[0] == _pinned(lock, "torch")
    runtime = _pinned(lock, "nvidia-cuda-runtime")
    # torch reports the CUDA it was built against (major.minor); the runtime wheel is that
    # family's patch release.
    assert runtime.split(".")[:2] == torch.version.cuda.split(".")[:2], (
        runtime,
        torch.version.cuda,
    )


# --- attention kernels against fp32 -----------------------------------------------------------

# The architecture each kernel generation runs on (FA4: Blackwell's tcgen05; FA3: Hopper's wgmma).
NEEDS_SM = {"fa4": (10,), "fa3": (9,), "fa2": (8, 9, 10, 12), "sdpa": ()}


def _runnable(backend: str) -> None:
    torch = _torch()
    cap = torch.cuda.get_device_capability()
    arches = NEEDS_SM[backend]
    if arches and cap[0] not in arches:
        pytest.skip(f"{backend} does not run on SM{cap[0]}{cap[1]} (runs on SM{arches[0]}x)")
    if backend != "sdpa" and not attention.module_importable(attention.MODULES[backend]):
        pytest.skip(f"{backend}: {attention.MODULES[backend]} is not installed in this environment")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("backend", attention.BACKENDS)
def test_attention_forward_and_backward_match_fp32(
    backend: str, case: Any, record_property: Any
) -> None:
    _runnable(backend)
    report = nm.compare_attention(nm.backend_fn(backend), case, _torch().bfloat16, "cuda")
    record_property("errors", report.describe())
    assert report.ok, report.describe()


# --- the trainer's step -------------------------------------------------------------------------

SFT = EXAMPLES / "sft" / "config.yaml"


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "activation-checkpointing"])
def test_bf16_step_matches_fp32_step(checkpointing: bool, record_property: Any) -> None:
    ac = f"--model.activation_checkpointing={str(checkpointing).lower()}"
    fp32 = nm.build_trainer("sft", SFT, ["--training.precision=fp32", ac], "cuda")
    bf16 = nm.build_trainer("sft", SFT, ["--training.precision=bf16", ac], "cuda")
    want, got = nm.measure_step(*fp32, update=True), nm.measure_step(*bf16, update=True)
    report = nm.compare_steps(got, want, nm.STEP_TOLERANCES["bf16"])
    record_property("errors", report.describe())
    assert report.ok, report.describe()


@pytest.mark.parametrize("method,example", [("offline-grpo", "grpo"), ("preference/dpo", "dpo")])
def test_step_on_the_gpu_matches_the_cpu(method: str, example: str, record_property: Any) -> None:
    """fp32 on both: what differs is the device's kernels and summation order only."""
    cfg = EXAMPLES / example / "config.yaml"
    fp32 = ["--training.precision=fp32"]
    want = nm.measure_step(*nm.build_trainer(method, cfg, fp32, "cpu"), update=True)
    got = nm.measure_step(*nm.build_trainer(method, cfg, fp32, "cuda"), update=True)
    report = nm.compare_steps(got, want, nm.STEP_TOLERANCES["fp32"])
    record_property("errors", report.describe())
    assert report.ok, report.describe()


def _run(tmp: Path, precision: str, *extra: str) -> tuple[list[float], dict[str, Any]]:
    rc, out = train_here(
        "sft", SFT, tmp, f"--training.precision={precision}", "--training.max_steps=8",
        "--checkpoint.every_steps=4", "--checkpoint.keep_last=0", *extra,
    )  # fmt: skip
    assert rc == 0, out[-3000:]
    from halo.train.checkpoints import checkpoint

    found = checkpoint.latest(tmp / "ck" / "tiny-sft")
    assert found is not None and found.path.name.endswith("_step_8"), found
    return [r["loss"] for r in metrics(tmp, "tiny-sft") if "loss" in r], checkpoint.load_weights(
        found.path
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_resume_on_the_gpu_continues_the_uninterrupted_run(
    tmp_path: Path, precision: str, record_property: Any
) -> None:
    """Resumed from step 4 (the step-8 checkpoint removed), the run ends where the
    uninterrupted run ended: bit for bit when two uninterrupted runs agree bit for bit
    (deterministic kernels), else within the precision's tolerance; junit says which."""
    import torch

    losses, weights = _run(tmp_path / "a", precision)
    again_losses, again_weights = _run(tmp_path / "b", precision)
    deterministic = again_losses == losses and all(
        torch.equal(again_weights[k], weights[k]) for k in weights
    )
    resumed = tmp_path / "r"
    shutil.copytree(tmp_path / "a" / "ck", resumed / "ck")
    for ck in (resumed / "ck" / "tiny-sft").glob("*_step_8"):
        shutil.rmtree(ck)
    r_losses, r_weights = _run(resumed, precision)
    record_property(
        "comparison", "bitwise" if deterministic else "tolerance (nondeterministic kernels)"
    )
    assert r_weights.keys() == weights.keys()
    if deterministic:
        assert r_losses[-1] == losses[-1]
        for k in weights:
            assert torch.equal(r_weights[k], weights[k]), k
        return
    rel = 1e-5 if precision == "fp32" else 2e-2
    assert abs(r_losses[-1] - losses[-1]) <= rel * max(1.0, abs(losses[-1]))
    for k in weights:
        torch.testing.assert_close(r_weights[k], weights[k], rtol=rel * 10, atol=rel, msg=k)


# --- DeepEP ------------------------------------------------------------------------------------

DEEPEP = Path(__file__).resolve().parent / "deepep_roundtrip.py"


def deepep_round_trip(nproc: int, timeout: float = 300) -> None:
    """DeepEP intranode dispatch + combine across ``nproc`` GPUs (torchrun, one rank each)."""
    if not attention.module_importable("deep_ep"):
        pytest.skip("deep_ep is not installed in this environment (the GPU images build it)")
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", str(DEEPEP)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.count("deepep: round trip ok") == nproc, r.stdout[-2000:]


def test_deepep_intranode_round_trip() -> None:
    gpus = _torch().cuda.device_count()
    if gpus < 2:
        pytest.skip(
            f"DeepEP's intranode exchange needs at least 2 GPUs, {gpus} visible here: "
            "gpu_full's test_deepep_intranode_on_every_gpu runs it on a multi-GPU machine"
        )
    deepep_round_trip(2)


def test_attention_backend_fits_the_architecture_and_agrees_with_sdpa() -> None:
    torch = _torch()
    from halo.train.models import attention

    cap = torch.cuda.get_device_capability()
    choice = attention.select("auto", cap, attention.module_importable, half_precision=True)
    expected = {10: "fa4", 9: "fa3"}.get(cap[0])
    if expected and attention.module_importable(attention.MODULES[expected]):
        assert choice.backend == expected, choice
    kernel = attention.kernel(choice.backend)
    if kernel is None:
        pytest.skip(
            f"no flash-attention kernel for SM{cap[0]}{cap[1]} in this environment ({choice.reason})"
        )
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 256, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = kernel(q, k, v, causal=True)
    out = out[0] if isinstance(out, tuple) else out
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    torch.testing.assert_close(out.float(), ref.float(), atol=3e-2, rtol=3e-2)


def test_transformers_attention_matches_sdpa_including_packed_rows() -> None:
    """The implementation the trainer hands transformers agrees with SDPA, and packed rows
    (position_ids restarting per example) stay separate under the varlen kernel."""
    torch = _torch()
    from transformers import AutoConfig, AutoModelForCausalLM

    from halo.train.data import batching, examples
    from halo.train.models import attention
    from halo.train.models.hf import ATTN_IMPLEMENTATION, logits

    choice = attention.select(
        "auto", torch.cuda.get_device_capability(), attention.module_importable, True
    )
    if choice.backend == "sdpa":
        pytest.skip(f"no flash-attention here ({choice.reason})")
    conf = AutoConfig.for_model(
        "llama", vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, intermediate_size=512,
    )  # fmt: skip
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(conf, attn_implementation="sdpa", dtype=torch.bfloat16)
    fast = AutoModelForCausalLM.from_config(
        conf, attn_implementation=ATTN_IMPLEMENTATION[choice.backend], dtype=torch.bfloat16
    )
    fast.load_state_dict(ref.state_dict())
    ref, fast = ref.cuda().eval(), fast.cuda().eval()
    seqs = [examples.Sequence(list(range(5, 45)), list(range(6, 46)), [1.0] * 40),
            examples.Sequence(list(range(50, 70)), list(range(51, 71)), [1.0] * 20)]  # fmt: skip
    packed = {k: v.cuda() for k, v in batching.pack(seqs).items()}
    padded = {k: v.cuda() for k, v in batching.pad(seqs, 0).items()}
    with torch.no_grad():
        a, b = logits(fast, packed)[0].float(), logits(ref, padded).float()
    torch.testing.assert_close(a[:40], b[0, :40], atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(a[40:], b[1, :20], atol=5e-2, rtol=5e-2)


def test_sft_example_trains_in_bf16_on_the_gpu(tmp_path: Path) -> None:
    r = run_halo(
        "launch",
        "sft",
        str(EXAMPLES / "sft" / "config.yaml"),
        "--",
        *outputs(tmp_path),
        "--training.precision=bf16",
        "--training.max_steps=24",
        "--checkpoint.every_steps=0",
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "attention: " in r.stdout + r.stderr
    rows = [
        json.loads(x)
        for x in (tmp_path / "logs" / "tiny-sft" / "metrics.jsonl").read_text().splitlines()
    ]
    losses = [row["loss"] for row in rows]
    assert len(losses) == 24
    assert sum(losses[-4:]) / 4 < 0.7 * sum(losses[:4]) / 4, losses
