"""Publishing to a real OCI registry (Debian's docker-registry, started by .ci/run)."""

from __future__ import annotations

import os
import socket
import uuid

import pytest
from support import REPO, docker_or_skip, halo

from halo.images.docker import Docker

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def registry() -> str:
    address = os.environ.get("HALO_TEST_REGISTRY", "")
    if not address:
        pytest.skip(
            "needs a local OCI registry: set HALO_TEST_REGISTRY=127.0.0.1:5000 (.ci/run starts one)"
        )
    host, _, port = address.partition(":")
    try:
        socket.create_connection((host, int(port or 80)), timeout=2).close()
    except OSError as exc:
        pytest.skip(f"needs a local OCI registry at {address}: {exc}")
    return f"{address}/halo-test-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def docker() -> Docker:
    docker = docker_or_skip()
    built = halo("image", "build", "cpu", cwd=REPO)
    assert built.returncode == 0, built.stderr[-2000:]
    return docker


def test_push_publishes_both_tags_at_one_digest_and_is_idempotent(
    registry: str, docker: Docker
) -> None:
    first = halo("image", "push", "cpu", "--registry", registry, cwd=REPO)
    assert first.returncode == 0, first.stderr
    local = docker.image_id("halo:cpu")
    input_hash = docker.inspect("halo:cpu", '{{index .Config.Labels "io.halo.input-hash"}}')
    assert docker.remote_config_digest(f"{registry}/halo:cpu") == local
    assert docker.remote_config_digest(f"{registry}/halo:cpu-{input_hash[:12]}") == local
    again = halo("image", "push", "cpu", "--registry", registry, cwd=REPO)
    assert again.returncode == 0 and "already there" in again.stdout


def test_an_immutable_tag_is_never_moved(registry: str, docker: Docker) -> None:
    input_hash = docker.inspect("halo:cpu", '{{index .Config.Labels "io.halo.input-hash"}}')
    squatter = f"{registry}-squat/halo:cpu-{input_hash[:12]}"
    other = next(
        r for r in docker.refs("halo-base/*") if docker.image_id(r) != docker.image_id("halo:cpu")
    )
    docker.tag(other, squatter)
    docker.push(squatter)
    proc = halo("image", "push", "cpu", "--registry", f"{registry}-squat", cwd=REPO)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].endswith("; an immutable tag is never moved")
    assert docker.remote_config_digest(squatter) == docker.image_id(other)
    assert docker.remote_config_digest(f"{registry}-squat/halo:cpu") is None, (
        "nothing else was pushed"
    )


def test_push_without_a_registry_is_one_line() -> None:
    env = {"HALO_REGISTRY": ""}
    proc = halo("image", "push", "cpu", cwd=REPO, env=env)
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == "halo: error: halo image push: no registry; pass --registry HOST[/ALIAS] or set HALO_REGISTRY"
    )
