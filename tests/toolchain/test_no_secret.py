"""A token in the git remote URL reaches no label, build record, SBOM, log or annotation."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from publish_support import Namespace, namespace
from support import docker_or_skip, halo

from halo.images.docker import Docker
from halo.images.provenance import annotations
from halo.registry.client import Registry
from halo.registry.refs import parse_ref, redact_url

pytestmark = pytest.mark.docker


@pytest.mark.parametrize(
    ("remote", "shown"),
    [
        (
            "https://user:ghp_SECRET@example.invalid/org/halo.git",
            "https://example.invalid/org/halo.git",
        ),
        (
            "https://x-access-token:SECRET@example.invalid:8443/org/halo",
            "https://example.invalid:8443/org/halo",
        ),
        (
            "https://example.invalid/org/halo.git?token=SECRET#frag",
            "https://example.invalid/org/halo.git",
        ),
        ("git@example.invalid:org/halo.git", "ssh://example.invalid/org/halo.git"),
        ("ssh://git:SECRET@example.invalid/org/halo.git", "ssh://example.invalid/org/halo.git"),
        ("SECRET@", ""),
    ],
)
def test_urls_are_shown_without_userinfo(remote: str, shown: str) -> None:
    assert redact_url(remote) == shown
    assert "SECRET" not in redact_url(remote)


@pytest.fixture
def ns() -> Iterator[Namespace]:
    yield from namespace()


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@example.invalid", "-c", "user.name=t", "-C", str(repo), *args],
        check=True,
        capture_output=True,
    )


# Staged, it shares halo:cpu's stack layer with the publishing test's image: one after the other,
# the second finds that layer compressed in the export cache instead of compressing it again.
@pytest.mark.xdist_group("stage-halo-cpu")
def test_a_token_in_the_remote_url_never_leaves_the_machine(repo_copy: Path, ns: Namespace) -> None:
    docker: Docker = docker_or_skip()
    token = "ghp_" + secrets.token_hex(16)
    _git(repo_copy, "init", "-q")
    _git(
        repo_copy,
        "remote",
        "add",
        "origin",
        f"https://halo-bot:{token}@example.invalid/org/halo.git",
    )
    # Other inputs than the checkout's (one more line under halo/): a real build, not a no-op.
    marker = repo_copy / "halo" / "devtools" / "__init__.py"
    marker.write_text(marker.read_text() + f"# token test {token[-6:]}\n")
    # Tagged under a repository of its own: halo:cpu, which other tests read, is never moved.
    name = f"halo-test-token-{token[-8:]}"
    catalog = repo_copy / "images" / "images.yaml"
    catalog.write_text(catalog.read_text().replace("repository: halo\n", f"repository: {name}\n"))
    _git(repo_copy, "add", "-A")
    _git(repo_copy, "commit", "-qm", "token test")

    built = halo("image", "build", "cpu", cwd=repo_copy)
    log = built.stdout + built.stderr
    ref = next(w for w in built.stdout.split() if w.startswith("cpu-"))
    image = f"{name}:{ref}"
    try:
        assert built.returncode == 0, log[-2000:]
        assert token not in log
        inspect = subprocess.run(
            [docker.exe, "image", "inspect", image], capture_output=True, text=True, check=True
        ).stdout
        labels = json.loads(inspect)[0]["Config"]["Labels"]
        assert "io.halo.input-hash" in labels and ref[4:] in labels["io.halo.input-hash"]
        assert token not in inspect and "halo-bot" not in inspect
        inside = docker.run(
            [
                "--rm",
                "--network=none",
                "--entrypoint",
                "cat",
                image,
                "/etc/halo/build.json",
                "/etc/halo/sbom.cdx.json",
            ],
            capture=True,
        )
        assert inside.returncode == 0, inside.stderr
        assert '"input_hash"' in inside.stdout and '"bomFormat"' in inside.stdout
        assert token not in inside.stdout

        # Where the repository URL does go: the manifest's annotations, without the token.
        assert annotations(repo_copy)["org.opencontainers.image.source"] == (
            "https://example.invalid/org/halo.git"
        )
        staged = halo("image", "stage", "cpu", "--registry", ns.registry("staging"), cwd=repo_copy)
        assert staged.returncode == 0, staged.stderr[-2000:]
        assert token not in staged.stdout + staged.stderr
        pinned = ns.remember(staged.stdout.split()[1])
        src = parse_ref(pinned)
        manifest = Registry(src.repo.host).get_manifest(src.repo, str(src.digest))
        assert manifest is not None
        notes = manifest.json["annotations"]
        assert notes["org.opencontainers.image.source"] == "https://example.invalid/org/halo.git"
        assert len(notes["org.opencontainers.image.revision"]) == 40
        assert token not in manifest.body.decode()
    finally:
        for tagged in docker.refs(name):
            docker.remove(tagged)
