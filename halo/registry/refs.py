"""Image references (``HOST[:PORT]/PATH[:TAG][@sha256:…]``) and URLs safe to show.

Plain HTTP is used only for loopback registries (127.0.0.0/8, ::1, localhost): anything
else is HTTPS, so `--insecure` has no way to leak a credential over the network.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from halo.errors import HaloError
from halo.urls import redact_url  # the one redaction (its readers import it here too)

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_PATH = re.compile(
    r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$"
)


def is_loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") else host
    name = name.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Repo:
    """A repository on a registry: ``host`` (with port) and ``path`` (``alias/halo``)."""

    host: str
    path: str

    @property
    def base_url(self) -> str:
        scheme = "http" if is_loopback(self.host) else "https"
        return f"{scheme}://{self.host}/v2/{self.path}"

    def __str__(self) -> str:
        return f"{self.host}/{self.path}"

    def ref(self, tag_or_digest: str) -> str:
        sep = "@" if tag_or_digest.startswith("sha256:") else ":"
        return f"{self}{sep}{tag_or_digest}"


@dataclass(frozen=True)
class Ref:
    repo: Repo
    tag: str | None
    digest: str | None

    def __str__(self) -> str:
        return self.repo.ref(self.digest or self.tag or "latest")


def parse_registry(text: str, what: str = "registry") -> tuple[str, str]:
    """``HOST[:PORT][/PREFIX]`` (e.g. ``public.ecr.aws/alias``) as (host, prefix)."""
    value = text.strip().rstrip("/")
    if "://" in value or "@" in value:
        raise HaloError(
            f"{what} {redact_url(value)!r}: expected HOST[:PORT][/PREFIX], without a scheme or credentials"
        )
    host, _, prefix = value.partition("/")
    if not host or ("." not in host and ":" not in host and host != "localhost"):
        raise HaloError(
            f"{what} {value!r}: expected HOST[:PORT][/PREFIX] (a host name with a dot or a port)"
        )
    if prefix and not _PATH.match(prefix):
        raise HaloError(f"{what} {value!r}: '{prefix}' is not a valid repository path")
    return host, prefix


def repo_under(registry: str, name: str) -> Repo:
    host, prefix = parse_registry(registry)
    return Repo(host, f"{prefix}/{name}" if prefix else name)


def parse_ref(text: str) -> Ref:
    """A full reference; a digest, when present, is what counts."""
    rest, _, digest = text.partition("@")
    if digest and not DIGEST.match(digest):
        raise HaloError(f"{text}: digest must be sha256:<64 hex>")
    tag = None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        rest, tag = rest.rsplit(":", 1)
        if not _TAG.match(tag):
            raise HaloError(f"{text}: '{tag}' is not a valid tag")
    host, path = parse_registry(rest, "image reference")
    if not path:
        raise HaloError(f"{text}: expected HOST/REPOSITORY[:TAG][@sha256:…]")
    return Ref(Repo(host, path), tag, digest or None)
