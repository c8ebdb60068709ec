"""`halo image push`: publish the moving tag and the immutable tag; never move an immutable one.

The registry is configuration (--registry or $HALO_REGISTRY): ECR Public, or any OCI registry.
Credentials are docker's own (`docker login`; for ECR Public, the AWS CLI's login password),
never handled here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from halo.errors import HaloError
from halo.images.catalog import Image
from halo.images.docker import Docker

INPUT_LABEL = "io.halo.input-hash"


@dataclass(frozen=True)
class Pushed:
    image: Image
    moving: str
    immutable: str
    config_digest: str
    immutable_was_there: bool


def registry_from(arg: str | None) -> str:
    registry = arg or os.environ.get("HALO_REGISTRY", "")
    if not registry:
        raise HaloError(
            "halo image push: no registry; pass --registry HOST[/ALIAS] or set HALO_REGISTRY"
        )
    return registry.rstrip("/")


def push_image(image: Image, registry: str, docker: Docker) -> Pushed:
    local_id = docker.image_id(image.moving_ref)
    if local_id is None:
        raise HaloError(
            f"{image.moving_ref}: not built here; run `halo image build {image.name}` first"
        )
    input_hash = docker.inspect(image.moving_ref, f'{{{{index .Config.Labels "{INPUT_LABEL}"}}}}')
    if len(input_hash) != 64:
        raise HaloError(
            f"{image.moving_ref}: has no {INPUT_LABEL} label; only images built by halo are pushed"
        )
    remote = f"{registry}/{image.publish}"
    moving = f"{remote}:{image.tag}"
    immutable = f"{remote}:{image.tag}-{input_hash[:12]}"
    there = docker.remote_config_digest(immutable)
    if there is not None and there != local_id:
        raise HaloError(
            f"{immutable}: already points at {there[:19]}, not {local_id[:19]}; an immutable tag is never moved"
        )
    for ref in (immutable, moving):
        docker.tag(image.moving_ref, ref)
    if there is None:
        docker.push(immutable)
    docker.push(moving)
    for ref in (immutable, moving):
        if docker.remote_config_digest(ref) != local_id:
            raise HaloError(f"{ref}: after the push the registry does not serve {local_id[:19]}")
    return Pushed(image, moving, immutable, local_id, there is not None)
