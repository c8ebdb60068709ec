"""Pushing new policy weights to a vLLM server, and checking which weights it serves.

The push is vLLM's in-place reload (development endpoints, VLLM_SERVER_DEV_MODE=1): pause
generation once in-flight requests finish, have every worker reload the weights from an
exported Hugging Face folder (`collective_rpc reload_weights` with ``weights_path``), drop the
prefix cache (its KV was computed by the old weights), resume. No restart: the engine, its
compiled graphs and KV cache stay; only the tensors change.

The check does not trust the push: the server scores a fixed probe sequence and its
log-probabilities must equal the trainer's own for the weights it just exported.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from halo.rollout.client import Client, RolloutError


def reload(client: Client, weights_path: str) -> float:
    """Seconds the in-place reload took; ``weights_path`` as the server sees the folder."""
    t0 = time.monotonic()
    client.call("POST", "/pause?mode=wait")
    try:
        client.call(
            "POST",
            "/collective_rpc",
            {"method": "reload_weights", "kwargs": {"weights_path": weights_path}},
        )
        client.call("POST", "/reset_prefix_cache")
    finally:
        client.call("POST", "/resume")
    return time.monotonic() - t0


def check_served(
    client: Client, probe: Sequence[int], expected: Sequence[float], tolerance: float
) -> tuple[list[float], float]:
    """The server's log-probs of ``probe`` and their largest gap to the trainer's ``expected``;
    a gap above ``tolerance`` is an error: the server serves other weights than pushed."""
    served = client.prompt_logprobs(probe)
    if len(served) != len(expected):
        raise RolloutError(
            f"{client.shown}: scored {len(served)} probe tokens, the trainer {len(expected)}", False
        )
    gap = max(abs(a - b) for a, b in zip(served, expected, strict=True))
    if gap > tolerance:
        raise RolloutError(
            f"{client.shown}: serves other weights than the trainer pushed "
            f"(probe log-probs differ by {gap:.4f} > {tolerance})",
            False,
        )
    return served, gap
