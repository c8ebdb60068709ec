"""A small JSON client for the rollout servers' HTTP API (standard library only)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

TIMEOUT_S = 120  # a first completion on a cold server compiles graphs


@dataclass(frozen=True)
class Server:
    url: str

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=TIMEOUT_S) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def get_json(self, path: str) -> Any:
        status, body = self.get(path)
        assert status == 200, f"GET {path}: HTTP {status}: {body[:500]!r}"
        return json.loads(body)

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """Any body, any answer: what the bad-request tests need."""
        req = urllib.request.Request(
            self.url + path, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def post_json(self, path: str, payload: dict[str, Any]) -> Any:
        status, body = self.post(path, json.dumps(payload).encode())
        assert status == 200, f"POST {path}: HTTP {status}: {body[:500]!r}"
        return json.loads(body)
