"""A client for the OCI distribution HTTP API: the registry edge of publishing.

It does what docker's CLI cannot: read and write manifests by digest, upload and mount
blobs, and tag without pushing again (PUT the same manifest bytes under a tag). Everything
read is checked against its digest. Authentication follows the registry's challenge:
Bearer tokens (ECR Public, GHCR, Docker Hub) fetched with docker's stored credentials, or
anonymously; Basic where a registry asks for it.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO, Any

from halo.errors import HaloError
from halo.registry.auth import Credentials, docker_credentials
from halo.registry.refs import DIGEST, Repo

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
IMAGE_MANIFESTS = (OCI_MANIFEST, DOCKER_MANIFEST)
ACCEPT = ", ".join((OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST))
TIMEOUT = 120


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Manifest:
    body: bytes
    media_type: str

    @property
    def digest(self) -> str:
        return sha256_digest(self.body)

    @property
    def json(self) -> dict[str, Any]:
        data = json.loads(self.body)
        if not isinstance(data, dict):
            raise HaloError(f"{self.digest}: a manifest must be a JSON object")
        return data

    def blobs(self) -> list[dict[str, Any]]:
        """The config and layer descriptors of an image manifest (refusing indexes)."""
        data = self.json
        if self.media_type not in IMAGE_MANIFESTS or "config" not in data:
            raise HaloError(
                f"{self.digest}: is {self.media_type or 'not an image manifest'}; only single-image "
                "manifests are published here"
            )
        return [data["config"], *data.get("layers", [])]


class _NoAuthRedirects(urllib.request.HTTPRedirectHandler):
    """Follow a blob's redirect (to object storage) without the registry's Authorization."""


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', rest))


def _error_line(exc: urllib.error.HTTPError) -> str:
    try:
        body = exc.read().decode(errors="replace")
        errors = json.loads(body).get("errors") or []
        if errors:
            e = errors[0]
            return f"HTTP {exc.code} {e.get('code', '')}: {e.get('message', '')}".strip()
    except (OSError, ValueError, AttributeError):
        pass
    return f"HTTP {exc.code} {exc.reason}"


@dataclass
class Registry:
    """One registry host. ``anonymous`` never sends a credential, whatever docker has stored."""

    host: str
    anonymous: bool = False
    _tokens: dict[str, str] = field(default_factory=dict)
    _basic: bool = False

    def __post_init__(self) -> None:
        self._opener = urllib.request.build_opener(_NoAuthRedirects())
        self._creds: Credentials | None = None if self.anonymous else docker_credentials(self.host)

    # -- transport ---------------------------------------------------------------------------

    def _token(self, params: dict[str, str], scopes: list[str]) -> str:
        key = " ".join(scopes)
        if key in self._tokens:
            return self._tokens[key]
        query = [("service", params["service"])] if "service" in params else []
        query += [("scope", s) for s in scopes]
        url = (
            params["realm"]
            + ("&" if "?" in params["realm"] else "?")
            + urllib.parse.urlencode(query)
        )
        req = urllib.request.Request(url)
        if self._creds:
            req.add_unredirected_header("Authorization", self._creds.basic())
        try:
            with self._opener.open(req, timeout=TIMEOUT) as resp:
                data = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            who = "anonymously" if self._creds is None else f"as {self._creds.username}"
            raise HaloError(
                f"{self.host}: token for {key} refused {who} ({_error_line(exc)})"
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise HaloError(f"{self.host}: token service did not answer ({exc})") from None
        token = data.get("token") or data.get("access_token")
        if not token:
            raise HaloError(f"{self.host}: token service answered without a token")
        self._tokens[key] = str(token)
        return self._tokens[key]

    def _auth_header(self, scopes: list[str]) -> str | None:
        key = " ".join(scopes)
        if key in self._tokens:
            return f"Bearer {self._tokens[key]}"
        if self._basic and self._creds:
            return self._creds.basic()
        return None

    def request(
        self,
        method: str,
        url: str,
        scopes: list[str],
        headers: dict[str, str] | None = None,
        data: bytes | IO[bytes] | None = None,
        ok: Iterable[int] = (200,),
        missing_ok: bool = False,
    ) -> Any:
        """One call; on a 401 the challenge is answered once and the call repeated.

        Returns the open response (the caller reads and closes it), or None for a 404
        when ``missing_ok``.
        """
        for attempt in (0, 1):
            req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
            if auth := self._auth_header(scopes):
                req.add_unredirected_header("Authorization", auth)
            try:
                resp = self._opener.open(req, timeout=TIMEOUT)
            except urllib.error.HTTPError as exc:
                if exc.code == 401 and attempt == 0 and not hasattr(data, "read"):
                    self._answer(exc.headers.get("WWW-Authenticate", ""), scopes)
                    continue
                if exc.code == 404 and missing_ok:
                    return None
                line = _error_line(exc)
                if "NAME_UNKNOWN" in line and method in ("POST", "PUT"):
                    # ECR Public does not create repositories on push, and neither does halo.
                    line += "; create the repository once by hand (README, Publishing)"
                raise HaloError(f"{self.host}: {method} {_path(url)}: {line}") from None
            except (urllib.error.URLError, OSError) as exc:
                raise HaloError(
                    f"{self.host}: registry did not answer {method} {_path(url)} ({exc})"
                ) from None
            if resp.status not in ok:
                resp.close()
                raise HaloError(
                    f"{self.host}: {method} {_path(url)}: unexpected HTTP {resp.status}"
                )
            return resp
        raise HaloError(
            f"{self.host}: {method} {_path(url)}: still unauthorized after authenticating"
        )

    def _answer(self, header: str, scopes: list[str]) -> None:
        scheme, params = _challenge(header)
        if scheme == "bearer" and "realm" in params:
            self._token(params, scopes)
        elif scheme == "basic" and self._creds:
            self._basic = True
        else:
            who = (
                "anonymous pulls are not allowed"
                if self._creds is None
                else "no usable credentials"
            )
            raise HaloError(
                f"{self.host}: authentication required ({who}; `docker login {self.host}`)"
            )

    # -- the API -----------------------------------------------------------------------------

    def ping(self) -> None:
        resp = self.request("GET", Repo(self.host, "_").base_url.rsplit("/", 1)[0] + "/", [])
        resp.close()

    def get_manifest(self, repo: Repo, reference: str) -> Manifest | None:
        resp = self.request(
            "GET",
            f"{repo.base_url}/manifests/{reference}",
            [f"repository:{repo.path}:pull"],
            headers={"Accept": ACCEPT},
            missing_ok=True,
        )
        if resp is None:
            return None
        with resp:
            body = resp.read()
            media = (resp.headers.get("Content-Type") or "").split(";")[0].strip()
        manifest = Manifest(body, media or str(json.loads(body).get("mediaType", "")))
        if DIGEST.match(reference) and manifest.digest != reference:
            raise HaloError(
                f"{repo.ref(reference)}: the registry served a manifest with digest {manifest.digest}"
            )
        return manifest

    def put_manifest(self, repo: Repo, reference: str, manifest: Manifest) -> str:
        """Store ``manifest`` under a digest or a tag; returns the digest the registry reports."""
        resp = self.request(
            "PUT",
            f"{repo.base_url}/manifests/{reference}",
            [f"repository:{repo.path}:pull,push"],
            headers={"Content-Type": manifest.media_type},
            data=manifest.body,
            ok=(200, 201, 202),
        )
        with resp:
            reported = resp.headers.get("Docker-Content-Digest") or manifest.digest
        if reported != manifest.digest:
            raise HaloError(
                f"{repo.ref(reference)}: the registry stored {reported}, not {manifest.digest}"
            )
        return reported

    def referrers(self, repo: Repo, digest: str, artifact_type: str = "") -> Manifest | None:
        """The OCI 1.1 referrers API's image index for ``digest``; None where the registry has no
        such API (distribution 2.8: then the ``sha256-<hex>`` tag schema is the fallback)."""
        query = (
            "?" + urllib.parse.urlencode({"artifactType": artifact_type}) if artifact_type else ""
        )
        resp = self.request(
            "GET",
            f"{repo.base_url}/referrers/{digest}{query}",
            [f"repository:{repo.path}:pull"],
            headers={"Accept": OCI_INDEX},
            missing_ok=True,
        )
        if resp is None:
            return None
        with resp:
            body = resp.read()
            media = (resp.headers.get("Content-Type") or "").split(";")[0].strip()
        return Manifest(body, media) if media == OCI_INDEX else None

    def has_blob(self, repo: Repo, digest: str) -> bool:
        resp = self.request(
            "HEAD",
            f"{repo.base_url}/blobs/{digest}",
            [f"repository:{repo.path}:pull"],
            missing_ok=True,
        )
        if resp is None:
            return False
        resp.close()
        return True

    def blob_bytes(self, repo: Repo, digest: str) -> bytes:
        with self.open_blob(repo, digest) as resp:
            data: bytes = resp.read()
        if sha256_digest(data) != digest:
            raise HaloError(f"{repo.ref(digest)}: the registry served other bytes")
        return data

    def open_blob(self, repo: Repo, digest: str) -> Any:
        return self.request(
            "GET", f"{repo.base_url}/blobs/{digest}", [f"repository:{repo.path}:pull"]
        )

    def _start_upload(
        self, repo: Repo, query: str = "", scopes: list[str] | None = None
    ) -> tuple[int, str]:
        resp = self.request(
            "POST",
            f"{repo.base_url}/blobs/uploads/{query}",
            scopes or [f"repository:{repo.path}:pull,push"],
            data=b"",
            ok=(201, 202),
        )
        with resp:
            return resp.status, urllib.parse.urljoin(resp.url, resp.headers.get("Location", ""))

    def upload_blob(
        self, repo: Repo, digest: str, size: int, stream: IO[bytes], location: str | None = None
    ) -> None:
        """POST, one streamed PATCH, PUT ?digest= (docker's own sequence; ECR accepts it)."""
        scopes = [f"repository:{repo.path}:pull,push"]
        if location is None:
            _, location = self._start_upload(repo)
        resp = self.request(
            "PATCH",
            location,
            scopes,
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            data=stream,
            ok=(202, 204),
        )
        with resp:
            location = urllib.parse.urljoin(resp.url, resp.headers.get("Location", location))
        sep = "&" if "?" in location else "?"
        resp = self.request(
            "PUT",
            f"{location}{sep}digest={digest}",
            scopes,
            headers={"Content-Length": "0"},
            data=b"",
            ok=(201, 204),
        )
        resp.close()

    def mount_blob(self, repo: Repo, digest: str, source: Repo) -> str | None:
        """Cross-repository mount on one registry: None when mounted, else an upload to continue."""
        status, location = self._start_upload(
            repo,
            "?" + urllib.parse.urlencode({"mount": digest, "from": source.path}),
            [f"repository:{repo.path}:pull,push", f"repository:{source.path}:pull"],
        )
        return None if status == 201 else location


def _path(url: str) -> str:
    return urllib.parse.urlsplit(url).path
