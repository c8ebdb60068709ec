"""Test support for publishing: a namespace on the local registry, small images made to order."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import tarfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from halo.registry.client import ACCEPT


def registry_address() -> str:
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
    return address


@dataclass
class Namespace:
    """``HOST/ship-test-XXXX``: everything a test pushes lives under it and is deleted after."""

    address: str
    prefix: str
    repos: set[str] = field(default_factory=set)
    untagged: dict[str, set[str]] = field(default_factory=dict)  # staged digests, by repo

    def registry(self, sub: str) -> str:
        return f"{self.address}/{self.prefix}/{sub}"

    def track(self, registry: str, name: str) -> str:
        path = f"{registry.split('/', 1)[1]}/{name}"
        self.repos.add(path)
        return path

    def remember(self, ref: str) -> str:
        """A digest reference pushed without a tag, so that cleanup finds it."""
        repo, _, digest = ref.partition("@")
        path = repo.split("/", 1)[1]
        self.repos.add(path)
        self.untagged.setdefault(path, set()).add(digest)
        return ref

    def _get(self, url: str, method: str = "GET") -> urllib.request.Request:
        return urllib.request.Request(url, method=method, headers={"Accept": ACCEPT})

    def digests(self, path: str) -> set[str]:
        base = f"http://{self.address}/v2/{path}"
        try:
            with urllib.request.urlopen(self._get(f"{base}/tags/list"), timeout=10) as resp:
                tags = json.load(resp).get("tags") or []
        except urllib.error.HTTPError:
            return set()
        found = set()
        for tag in tags:
            with urllib.request.urlopen(
                self._get(f"{base}/manifests/{tag}", "HEAD"), timeout=10
            ) as r:
                found.add(r.headers["Docker-Content-Digest"])
        return found

    def cleanup(self) -> None:
        for path in self.repos:
            for digest in self.digests(path) | self.untagged.get(path, set()):
                req = urllib.request.Request(
                    f"http://{self.address}/v2/{path}/manifests/{digest}", method="DELETE"
                )
                with contextlib.suppress(urllib.error.HTTPError):
                    urllib.request.urlopen(req, timeout=10).close()


def namespace() -> Iterator[Namespace]:
    ns = Namespace(registry_address(), f"ship-test-{uuid.uuid4().hex[:8]}")
    yield ns
    ns.cleanup()


def small_image(
    docker: str, ref: str, files: dict[str, bytes], mtime: int, labels: dict[str, str]
) -> str:
    """`docker import` of a tar holding ``files`` (all with ``mtime``), with ``labels``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            tar.addfile(info, io.BytesIO(data))
    argv = [docker, "import"]
    for k, v in sorted(labels.items()):
        argv += ["--change", f"LABEL {k}={v}"]
    subprocess.run([*argv, "-", ref], input=buf.getvalue(), capture_output=True, check=True)
    out = subprocess.run(
        [docker, "image", "inspect", "--format", "{{.Id}}", ref],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def push_by_digest(docker: str, ref: str, image_id: str, registry: str, name: str = "halo"):  # type: ignore[no-untyped-def]
    """Push a local image untagged, as `halo image stage` does; returns its Manifest."""
    import tempfile
    from pathlib import Path

    from halo.registry.client import Registry
    from halo.registry.refs import repo_under
    from halo.registry.transfer import ExportCache, push_local

    dest = repo_under(registry, name)
    with tempfile.TemporaryDirectory() as tmp:
        manifest, _ = push_local(
            Registry(dest.host),
            dest,
            docker,
            ref,
            image_id,
            {"org.opencontainers.image.revision": "0" * 40},
            Path(tmp),
            ExportCache(Path(tmp) / "cache"),
            lambda _: None,
        )
    return manifest
