"""Tensor parallelism of a transformers decoder, with DTensor's ``parallelize_module``.

Megatron's split, per decoder layer: q, k and v projections column-wise (each rank computes
its heads), the output projection row-wise (the partial sums all-reduced); a dense MLP's gate
and up column-wise, its down row-wise. The LM head is split column-wise with its logits
gathered (not when it is tied to the embeddings, which stay whole). Embeddings, norms and MoE
routers stay whole on every tp rank; experts are split by ep, not tp. Attention reshapes with
-1 heads, so each rank's attention runs on its own heads unchanged.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from halo.errors import HaloError


def plan(model: nn.Module) -> dict[str, Any]:
    """Module path -> ParallelStyle for every linear layer TP splits."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    styles: dict[str, Any] = {}
    for name, module in model.named_modules():
        if name.endswith("self_attn"):
            for proj in ("q_proj", "k_proj", "v_proj"):
                styles[f"{name}.{proj}"] = ColwiseParallel()
            styles[f"{name}.o_proj"] = RowwiseParallel()
            # Qwen3's per-head q/k norms see only this rank's heads: their weight's gradient
            # is a partial sum until DTensor reduces it (the heads dim as the sharded one).
            for norm in ("q_norm", "k_norm"):
                if hasattr(module, norm):
                    styles[f"{name}.{norm}"] = SequenceParallel(
                        sequence_dim=2, use_local_output=True
                    )
        elif name.endswith("mlp") and hasattr(module, "gate_proj"):
            styles[f"{name}.gate_proj"] = ColwiseParallel()
            styles[f"{name}.up_proj"] = ColwiseParallel()
            styles[f"{name}.down_proj"] = RowwiseParallel()
    if not styles:
        raise HaloError(
            f"model: no attention layers found in {type(model).__name__} to split by tp"
        )
    conf = getattr(model, "config", None)
    if hasattr(model, "lm_head") and not getattr(conf, "tie_word_embeddings", False):
        styles["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    return styles


def apply(model: nn.Module, tp_mesh: Any) -> None:
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(model, tp_mesh, plan(model))
