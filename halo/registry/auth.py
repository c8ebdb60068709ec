"""Registry credentials: docker's own (config.json, credential helpers), or none at all.

Nothing here stores a credential: `docker login` (or `halo image ecr-public-login`, or the
workflow's login actions) put them where docker keeps them, and this module reads them for
one host when a registry asks. ``anonymous()`` is what `halo image verify-public` uses: it
proves a pull works for someone with no credentials.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Credentials:
    username: str
    secret: str

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.secret}".encode()).decode()


def docker_config_dir() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")


def _host_keys(key: str) -> str:
    """A config.json key (``https://host/v1/``, ``host``) reduced to its host."""
    key = key.split("://", 1)[-1]
    return key.split("/", 1)[0]


def _helper(name: str, host: str) -> Credentials | None:
    try:
        proc = subprocess.run(
            [f"docker-credential-{name}", "get"],
            input=host,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return None
    user, secret = data.get("Username", ""), data.get("Secret", "")
    return Credentials(user, secret) if secret else None


def docker_credentials(host: str) -> Credentials | None:
    """What `docker login HOST` left: an inline auth, or a credential helper's answer."""
    path = docker_config_dir() / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(config, dict):
        return None
    helpers = config.get("credHelpers") or {}
    if isinstance(helpers, dict) and host in helpers:
        return _helper(str(helpers[host]), host)
    for key, entry in (config.get("auths") or {}).items():
        if _host_keys(key) != host or not isinstance(entry, dict):
            continue
        if entry.get("identitytoken"):
            return Credentials("<token>", str(entry["identitytoken"]))
        if entry.get("auth"):
            try:
                user, _, secret = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            return Credentials(user, secret)
    if store := config.get("credsStore"):
        return _helper(str(store), host)
    return None
