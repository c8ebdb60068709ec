"""The expert matmul: rows grouped by expert, times that expert's matrix.

``x`` holds the rows of expert 0, then expert 1, ... (``counts`` per expert); ``w`` is
(experts, in, out). ``torch._grouped_mm`` does every group in one kernel where the build has
it (CUDA on SM90+, and the CPU in torch 2.11); ``loop`` is one matmul per expert: the
reference that pins the numerics (tests compare the two) and the fallback elsewhere.
"""

from __future__ import annotations

from typing import Literal

import torch

Impl = Literal["auto", "grouped", "loop"]


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch._grouped_mm runs here for ``dtype``."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    if device.type == "cuda":
        # The kernels are bf16 on Hopper and newer (SM90+).
        return dtype == torch.bfloat16 and torch.cuda.get_device_capability(device) >= (9, 0)
    return device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)


def resolve(impl: Impl, device: torch.device, dtype: torch.dtype) -> Literal["grouped", "loop"]:
    if impl == "auto":
        return "grouped" if available(device, dtype) else "loop"
    return impl


def loop(x: torch.Tensor, w: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """One matmul per expert (the reference)."""
    outs = [part @ w[e] for e, part in enumerate(torch.split(x, counts)) if counts[e]]
    if not outs:
        return x.new_zeros(0, w.shape[-1]) + 0 * w.sum()  # keep w in the graph
    return torch.cat(outs)


def _contiguous_grad(grad: torch.Tensor) -> torch.Tensor:
    # grouped_mm's backward rejects expanded gradients (a sum's, stride 0).
    return grad.contiguous()


def grouped(x: torch.Tensor, w: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """All experts in one torch._grouped_mm (offsets: the cumulative row counts)."""
    if x.shape[0] == 0:
        return x.new_zeros(0, w.shape[-1]) + 0 * w.sum()
    offs = torch.tensor(counts, device=x.device, dtype=torch.int64).cumsum(0).to(torch.int32)
    out = torch._grouped_mm(x.to(w.dtype), w, offs=offs)
    if out.requires_grad:
        out.register_hook(_contiguous_grad)
    return out


def mm(x: torch.Tensor, w: torch.Tensor, counts: list[int], impl: Impl = "auto") -> torch.Tensor:
    if resolve(impl, x.device, w.dtype) == "grouped":
        return grouped(x, w, counts)
    return loop(x, w, counts)


def bias(b: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Each row's expert's bias (b: experts x out)."""
    index = torch.repeat_interleave(
        torch.arange(len(counts), device=b.device), torch.tensor(counts, device=b.device)
    )
    return b[index]
