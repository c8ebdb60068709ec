"""The network edge of fetch: find an artifact's download location on the configured indexes.

Uses the JSON form of the simple repository API (PEP 691). The index locations themselves
come from halo.sources (configuration), never from this repository.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

from packaging.utils import canonicalize_name as normalize

from halo.errors import HaloError
from halo.hashing import CHUNK
from halo.urls import redact_url, request

ACCEPT = "application/vnd.pypi.simple.v1+json"
TIMEOUT_S = 60
# Seconds between tries of a request that failed in a way that passes: a name lookup that
# timed out ("Temporary failure in name resolution" failed a whole CI run), a reset or timed
# out connection, an index answering 429 or 5xx. A refused connection or a 404 is not retried.
RETRY_DELAYS_S = (1.0, 3.0, 9.0)


def transient(exc: BaseException) -> bool:
    """Whether a failed request may succeed if tried again."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code == 429 or exc.code >= 500
    if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, BaseException):
        exc = exc.reason
    if isinstance(exc, socket.gaierror):
        return exc.errno == socket.EAI_AGAIN
    return isinstance(
        exc,
        TimeoutError
        | ConnectionResetError
        | ConnectionAbortedError
        | http.client.RemoteDisconnected,
    )


def urlopen(
    req: urllib.request.Request, delays: tuple[float, ...] = RETRY_DELAYS_S
) -> http.client.HTTPResponse:
    """urllib's urlopen, tried again after each of ``delays`` while it fails transiently."""
    for delay in (*delays, None):
        try:
            return urllib.request.urlopen(req, timeout=TIMEOUT_S)
        except (OSError, http.client.HTTPException) as exc:
            if delay is None or not transient(exc):
                raise
            time.sleep(delay)
    raise AssertionError("unreachable")


@dataclass
class IndexClient:
    urls: list[str]
    _pages: dict[str, list[dict]] = field(default_factory=dict)

    def _files(self, project: str) -> list[dict]:
        key = normalize(project)
        if key not in self._pages:
            files: list[dict] = []
            for base in self.urls:
                url = urllib.parse.urljoin(base, f"{key}/")
                req = request(url, headers={"Accept": ACCEPT})
                try:
                    with urlopen(req) as resp:
                        page = json.load(resp)
                except urllib.error.HTTPError as exc:
                    if exc.code == 404:
                        continue
                    raise HaloError(
                        f"{project}: index answered HTTP {exc.code} for its project page"
                    ) from None
                except (OSError, http.client.HTTPException, ValueError) as exc:
                    # URLError, a reset connection, a timeout; ValueError: not JSON, not UTF-8.
                    raise HaloError(
                        f"{project}: index unreachable or not PEP 691 JSON ({exc})"
                    ) from None
                if not isinstance(page, dict) or not isinstance(page.get("files", []), list):
                    raise HaloError(
                        f"{project}: index page is not PEP 691 JSON ({redact_url(url)})"
                    )
                for entry in page.get("files", []):
                    if not isinstance(entry, dict) or not isinstance(entry.get("url"), str):
                        continue
                    # Joined to the page's URL: a file on the index's own host keeps its
                    # userinfo (sent as a header by download), one elsewhere gets none.
                    entry["url"] = urllib.parse.urljoin(url, entry["url"])
                    files.append(entry)
            self._pages[key] = files
        return self._pages[key]

    def locate(self, project: str, filename: str, sha256: str) -> str | None:
        for entry in self._files(project):
            if entry.get("filename") == filename:
                listed = entry.get("hashes", {}).get("sha256")
                if listed and listed != sha256:
                    continue
                return entry["url"]
        return None

    @staticmethod
    def download(url: str) -> tuple[int | None, Iterator[bytes]]:
        """(Content-Length or None, the body in chunks); a dropped connection is one line."""
        name = urllib.parse.urlsplit(redact_url(url)).path.rsplit("/", 1)[-1] or redact_url(url)
        try:
            resp = urlopen(request(url))
        except (OSError, http.client.HTTPException) as exc:
            raise HaloError(f"{name}: download failed ({exc})") from None
        length = resp.headers.get("Content-Length")

        def chunks() -> Iterator[bytes]:
            got = 0
            with resp:
                try:
                    while chunk := resp.read(CHUNK):
                        got += len(chunk)
                        yield chunk
                except (OSError, http.client.HTTPException) as exc:
                    raise HaloError(
                        f"{name}: download interrupted after {got} bytes ({exc}); not kept"
                    ) from None

        return (int(length) if length and length.isdigit() else None), chunks()
