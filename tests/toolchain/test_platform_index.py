"""One tag for both platforms: `halo image index` against a real local registry.

The images indexed are stand-ins: a one-file image per platform, loaded here with the config
a build gives it (its platform, the input-hash label of the checkout's plan for it) and
tagged as the build tags it. What is under test is the index: what is pushed, how it is
tagged, what an anonymous check accepts and refuses; the builds are tested elsewhere.
"""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from publish_support import Namespace, registry_address
from support import docker_or_skip, halo

from halo.images.catalog import load_catalog
from halo.images.docker import Docker
from halo.images.evaluate.plan import evaluate
from halo.images.graph import AMD64, ARM64, INPUT_LABEL, ImageNode, Platform
from halo.registry.client import ACCEPT, OCI_INDEX

pytestmark = pytest.mark.docker
EPOCH = 1793491200


@pytest.fixture
def world(repo_copy: Path) -> Iterator[tuple[Path, Docker, str, str]]:
    """(checkout, engine, registry, repository): a copy publishing cpu under a name of its own."""
    docker = docker_or_skip()
    ns = Namespace(registry_address(), f"index-test-{uuid.uuid4().hex[:8]}")
    registry = ns.registry("r")
    name = f"halo-index-{uuid.uuid4().hex[:8]}"
    ns.track(registry, name)
    catalog = repo_copy / "images" / "images.yaml"
    text = catalog.read_text()
    catalog.write_text(
        text.replace("repository: halo\n", f"repository: {name}\n").replace(
            "publish: halo\n", f"publish: {name}\n"
        )
    )
    yield repo_copy, docker, registry, name
    ns.cleanup()
    for ref in docker.refs(name):
        docker.remove(ref)


def stand_in(docker: Docker, node: ImageNode, content: bytes) -> str:
    """A one-layer image for the node's platform, labelled and tagged as its build would be."""
    from halo.hashing import sha256_bytes
    from halo.images.reproducible import canonical, docker_archive

    with tempfile.TemporaryDirectory() as tmp:
        layer = Path(tmp) / "layer.tar"
        with tarfile.open(layer, "w") as tar:
            info = tarfile.TarInfo("etc/halo/stand-in")
            info.size, info.mtime = len(content), EPOCH
            tar.addfile(info, io.BytesIO(content))
        diff_id = "sha256:" + sha256_bytes(layer.read_bytes())
        config = {
            "architecture": node.platform.arch,
            "os": node.platform.os,
            "config": {"Labels": {INPUT_LABEL: node.hash}},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
        data = canonical(config)
        archive = Path(tmp) / "image.tar"
        docker_archive(archive, data, [node.immutable_ref], [(diff_id, layer)], EPOCH)
        docker.load(archive)
    return "sha256:" + sha256_bytes(data)


def _nodes(repo: Path) -> dict[Platform, ImageNode]:
    catalog = load_catalog(repo)
    return {p: evaluate(repo, catalog, catalog.image("cpu"), p).target for p in (AMD64, ARM64)}


def _manifest(registry: str, repository: str, reference: str) -> tuple[str, dict]:  # type: ignore[type-arg]
    host, _, prefix = registry.partition("/")
    url = f"http://{host}/v2/{prefix}/{repository}/manifests/{reference}"
    req = urllib.request.Request(url, headers={"Accept": ACCEPT})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.headers["Content-Type"], json.loads(resp.read())


def test_one_tag_serves_an_index_of_both_platforms(world) -> None:  # type: ignore[no-untyped-def]
    repo, docker, registry, name = world
    nodes = _nodes(repo)
    for p, node in nodes.items():
        stand_in(docker, node, f"{p}\n".encode())
    pushed = halo("image", "index", "cpu", "--registry", registry, cwd=repo)
    assert pushed.returncode == 0, pushed.stderr[-2000:]
    kind, index = _manifest(registry, name, "cpu")
    assert kind == OCI_INDEX
    platforms = {(m["platform"]["os"], m["platform"]["architecture"]) for m in index["manifests"]}
    assert platforms == {("linux", "amd64"), ("linux", "arm64")}
    for m in index["manifests"]:
        node = nodes[AMD64 if m["platform"]["architecture"] == "amd64" else ARM64]
        assert m["annotations"][INPUT_LABEL] == node.hash
        _, by_tag = _manifest(registry, name, f"cpu-{node.hash[:12]}")  # its own immutable tag
        assert by_tag["config"] == _manifest(registry, name, m["digest"])[1]["config"]

    checked = halo("image", "index", "cpu", "--registry", registry, "--verify", cwd=repo)
    assert checked.returncode == 0, checked.stderr
    assert "linux/amd64" in checked.stdout and "linux/arm64" in checked.stdout
    again = halo("image", "index", "cpu", "--registry", registry, cwd=repo)
    assert again.returncode == 0, again.stderr  # the same inputs again: the same index


def test_an_index_missing_a_platform_fails_the_check(world) -> None:  # type: ignore[no-untyped-def]
    repo, docker, registry, _ = world
    stand_in(docker, _nodes(repo)[AMD64], b"amd64 only\n")
    pushed = halo(
        "image", "index", "cpu", "--registry", registry, "--platforms", "linux/amd64", cwd=repo
    )
    assert pushed.returncode == 0, pushed.stderr
    checked = halo("image", "index", "cpu", "--registry", registry, "--verify", cwd=repo)
    assert checked.returncode == 2
    assert "platforms ['linux/amd64'], expected ['linux/amd64', 'linux/arm64']" in checked.stderr


def test_an_image_whose_config_says_another_platform_fails_the_check(world) -> None:  # type: ignore[no-untyped-def]
    """An amd64 image pushed as the arm64 entry: the index says arm64, the config does not."""
    repo, docker, registry, _ = world
    nodes = _nodes(repo)
    stand_in(docker, nodes[AMD64], b"amd64\n")
    liar = dataclasses.replace(nodes[ARM64], platform=AMD64)  # arm64's tag, amd64's config
    stand_in(docker, liar, b"not arm64\n")
    pushed = halo("image", "index", "cpu", "--registry", registry, cwd=repo)
    assert pushed.returncode == 0, pushed.stderr
    checked = halo("image", "index", "cpu", "--registry", registry, "--verify", cwd=repo)
    assert checked.returncode == 2
    assert "is linux/amd64 with input hash" in checked.stderr
    assert "the index says linux/arm64" in checked.stderr


def test_an_index_needs_every_platform_built_here_first(world) -> None:  # type: ignore[no-untyped-def]
    repo, docker, registry, _ = world
    stand_in(docker, _nodes(repo)[AMD64], b"amd64\n")
    proc = halo("image", "index", "cpu", "--registry", registry, cwd=repo)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert (
        "not built from this checkout's inputs; run `halo image build cpu --platform linux/arm64`"
        in line
    )
