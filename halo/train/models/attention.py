"""Which attention kernel to use, decided as a pure function of the device and what is importable.

FA4 (CuTe DSL) on SM100, FA3 on SM90, FA2 where installed, else torch SDPA. The choice and
the reason are returned so the trainer can log them.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

BACKENDS = ("fa4", "fa3", "fa2", "sdpa")

# The module each flash-attention generation is imported from.
MODULES = {"fa4": "flash_attn.cute", "fa3": "flash_attn_interface", "fa2": "flash_attn"}


@dataclass(frozen=True)
class Choice:
    backend: str
    reason: str


def select(
    requested: str,
    capability: tuple[int, int] | None,
    importable: Callable[[str], bool],
    half_precision: bool = True,
) -> Choice:
    """Pick an attention backend.

    ``capability`` is the CUDA compute capability (None on CPU); ``importable(module)`` says
    whether a module can be imported; flash kernels only take fp16/bf16 inputs.
    """
    if capability is None:
        if requested not in ("auto", "sdpa"):
            return Choice("sdpa", f"{requested} needs a CUDA GPU; no GPU here, using torch SDPA")
        return Choice("sdpa", "no CUDA GPU: torch SDPA")
    if not half_precision:
        return Choice("sdpa", "flash kernels need bf16/fp16; training in fp32: torch SDPA")
    major = capability[0]
    if requested == "sdpa":
        return Choice("sdpa", "requested sdpa")
    if requested != "auto":
        if importable(MODULES[requested]):
            return Choice(requested, f"requested {requested} ({MODULES[requested]} importable)")
        return Choice("sdpa", f"requested {requested} but {MODULES[requested]} is not importable")
    if major == 10 and importable(MODULES["fa4"]):
        return Choice("fa4", f"SM{major}0 and {MODULES['fa4']} importable")
    if major == 9 and importable(MODULES["fa3"]):
        return Choice("fa3", f"SM{major}0 and {MODULES['fa3']} importable")
    if major >= 8 and importable(MODULES["fa2"]):
        return Choice("fa2", f"SM{major}x and {MODULES['fa2']} importable")
    return Choice("sdpa", f"SM{major}x: no matching flash-attention installed, torch SDPA")


def module_importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        # find_spec imports the parent package; a broken or absent parent means "no".
        return False


def kernel(backend: str) -> Callable | None:
    """The flash-attention function for ``backend``: (B, T, H, D) tensors, causal; None for SDPA."""
    if backend == "sdpa":
        return None
    module = importlib.import_module(MODULES[backend])
    return module.flash_attn_func
