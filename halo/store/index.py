"""The network edge of fetch: find an artifact's download location on the configured indexes.

Uses the JSON form of the simple repository API (PEP 691). The index locations themselves
come from halo.sources (configuration), never from this repository.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

from halo.errors import HaloError
from halo.hashing import CHUNK
from halo.pins.lockfile import normalize

ACCEPT = "application/vnd.pypi.simple.v1+json"
TIMEOUT_S = 60


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
                req = urllib.request.Request(url, headers={"Accept": ACCEPT})
                try:
                    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
                        page = json.load(resp)
                except urllib.error.HTTPError as exc:
                    if exc.code == 404:
                        continue
                    raise HaloError(
                        f"{project}: index answered HTTP {exc.code} for its project page"
                    ) from None
                except (urllib.error.URLError, TimeoutError, json.JSONDecodeError) as exc:
                    raise HaloError(
                        f"{project}: index unreachable or not PEP 691 JSON ({exc})"
                    ) from None
                for entry in page.get("files", []):
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
        try:
            resp = urllib.request.urlopen(url, timeout=TIMEOUT_S)
        except (urllib.error.URLError, TimeoutError) as exc:
            raise HaloError(f"{url.rsplit('/', 1)[-1]}: download failed ({exc})") from None
        length = resp.headers.get("Content-Length")

        def chunks() -> Iterator[bytes]:
            with resp:
                while chunk := resp.read(CHUNK):
                    yield chunk

        return (int(length) if length else None), chunks()
