"""Which mesh dimensions each method trains with (no torch: `halo launch --list` shows it).

Data parallelism (replicated or FSDP-sharded) suits every method. Tensor and expert
parallelism change only how the model computes, so every causal-LM method takes them.
Context parallelism splits each sequence over ranks: SFT, whose loss is a plain sum over
tokens, takes it; the others need whole-sequence quantities (log-probability sums, rewards'
advantages over a completion) on one rank.
Methods this table does not name get data parallelism only.
"""

from __future__ import annotations

DIMS = ("dp_replicate", "dp_shard", "cp", "tp", "ep")
DATA = ("dp_replicate", "dp_shard")
MODEL = ("tp", "ep")

SUPPORTED: dict[str, tuple[str, ...]] = {
    "sft": DIMS,
    "offline-grpo": (*DATA, *MODEL),
    "online-grpo": (*DATA, *MODEL),
    "preference/dpo": (*DATA, *MODEL),
    "preference/simpo": (*DATA, *MODEL),
    "preference/smpo": (*DATA, *MODEL),
}
# The seed's flag (and config key) of each model-parallel dimension.
FLAG = {
    "cp": "context_parallel_size",
    "tp": "tensor_parallel_size",
    "ep": "expert_parallel_size",
}


def dims(method: str) -> tuple[str, ...]:
    return SUPPORTED.get(method, DATA)


def shown(method: str) -> str:
    """What `halo launch --list` prints: "dp_replicate dp_shard tp ep"."""
    return " ".join(dims(method))
