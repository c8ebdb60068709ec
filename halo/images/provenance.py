"""Where an image's source came from: the revision and repository, as OCI annotations.

They describe a push, not the image: the same inputs built from two commits (a docs-only
change) or two clones (SSH, HTTPS) are the same image, so these go on the manifest at push
time, never into the image config (see `halo.images.build.labels`). The repository URL is
shown without userinfo, query or fragment: a token in a remote URL never leaves this machine.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from halo.urls import redact_url

PREFIX = "org.opencontainers.image"


def _git(repo: Path, *args: str) -> str:
    try:
        proc = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
        )
    except OSError:
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def annotations(repo: Path) -> dict[str, str]:
    out = {}
    if revision := _git(repo, "rev-parse", "HEAD"):
        out[f"{PREFIX}.revision"] = revision
    if source := redact_url(_git(repo, "remote", "get-url", "origin")):
        out[f"{PREFIX}.source"] = source
    return out
