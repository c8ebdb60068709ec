"""An image's compressed size, measured: pushed by digest to a registry (a local one will do),
the manifest's layer sizes summed. What a pull downloads, not an estimate from the wheels.

The push goes under ``<registry>/halo-sizes/NAME``, by digest, no tag: a measurement, never a
publication, so CI stages of the training images (``stage_of``) are measured too. Layers are
compressed as `halo image stage` compresses them (gzip level 1) and kept in the export cache,
so staging the same image afterwards costs only the upload.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from halo.images.catalog import Image


@dataclass(frozen=True)
class Measured:
    name: str
    ref: str
    digest: str  # the manifest's, in the registry it was pushed to
    layers: int
    compressed: int  # bytes: the layers' sizes in the manifest, plus the config
    on_disk: int  # bytes: the engine's own count (docker image inspect .Size)


def measure(repo: Path, image: Image, registry: str, progress: Callable[[str], None]) -> Measured:
    from halo.images.docker import Docker
    from halo.images.publish import local_image_for_inputs
    from halo.paths import cache_home, scratch_root
    from halo.registry.client import Registry
    from halo.registry.refs import repo_under
    from halo.registry.transfer import ExportCache, push_local

    ref, image_id = local_image_for_inputs(repo, image)
    docker = Docker.discover()
    dest = repo_under(registry, f"halo-sizes/{image.name}")
    work = scratch_root() / "export"
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        manifest, _ = push_local(
            Registry(dest.host),
            dest,
            docker.exe,
            ref,
            image_id,
            {},
            Path(tmp),
            ExportCache(cache_home() / "exports"),
            progress,
        )
    blobs = manifest.blobs()  # the config first, then the layers
    return Measured(
        name=image.name,
        ref=ref,
        digest=manifest.digest,
        layers=len(blobs) - 1,
        compressed=sum(int(b["size"]) for b in blobs),
        on_disk=int(docker.inspect_json(ref)["Size"]),
    )
