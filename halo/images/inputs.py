"""The input hash of an image, by its old names (now halo.images.evaluate.inputs)."""

from __future__ import annotations

from halo.images.evaluate import inputs as _evaluated
from halo.images.evaluate.inputs import Inputs, image_inputs, source_pins

__all__ = ["Inputs", "base_identity", "image_inputs", "source_pins"]


def base_identity(state: object, recipe: str) -> str:
    """A base's identity in a hash: its recipe hash, whatever ``state`` (made here or not)."""
    return _evaluated.base_identity(recipe)
