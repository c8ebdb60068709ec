"""An image's inputs and their hash, by their old names (the plan is halo.images.evaluate.plan).

`resolve_inputs` evaluates the image for a platform and returns its inputs; ``docker`` is
accepted for the callers that pass one and is never asked: the hash comes from the checkout.
"""

from __future__ import annotations

from pathlib import Path

from halo.images.catalog_types import Catalog, Image
from halo.images.evaluate.plan import evaluate, labels, wanted_bases
from halo.images.graph import AMD64, INPUT_LABEL, LABEL_PREFIX, Inputs, Platform

__all__ = ["INPUT_LABEL", "LABEL_PREFIX", "labels", "resolve_inputs", "wanted_bases"]


def resolve_inputs(
    repo: Path, catalog: Catalog, image: Image, docker: object = None, platform: Platform = AMD64
) -> Inputs:
    return Inputs(evaluate(repo, catalog, image, platform).target.inputs)
