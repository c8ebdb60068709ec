"""The registry client's references and its answer to auth challenges.

A token gate (the way ECR Public, GHCR and Docker Hub work) is put in front of the real local
registry: every /v2/ call needs a Bearer token from the gate's realm; pull tokens are given to
anyone, push tokens only for the right Basic credentials. Everything else is the registry's.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import http.server
import io
import json
import secrets
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from publish_support import Namespace, namespace, registry_address

from halo.errors import HaloError
from halo.registry.client import OCI_MANIFEST, Manifest, Registry
from halo.registry.refs import Repo, is_loopback, parse_ref, parse_registry


def test_references_and_plain_http_only_for_loopback() -> None:
    ref = parse_ref("public.ecr.aws/alias/halo:cpu-0123456789ab")
    assert (ref.repo.host, ref.repo.path, ref.tag, ref.digest) == (
        "public.ecr.aws",
        "alias/halo",
        "cpu-0123456789ab",
        None,
    )
    pinned = parse_ref("127.0.0.1:5000/s/halo@sha256:" + "a" * 64)
    assert pinned.repo == Repo("127.0.0.1:5000", "s/halo") and pinned.digest
    assert Repo("public.ecr.aws", "alias/halo").base_url == "https://public.ecr.aws/v2/alias/halo"
    assert Repo("registry.example.invalid:5000", "h").base_url.startswith("https://")
    for host in ("127.0.0.1:5000", "localhost:5000", "[::1]:5000", "127.1.2.3"):
        assert is_loopback(host) and Repo(host, "h").base_url.startswith("http://"), host
    assert not is_loopback("10.0.0.1:5000")
    with pytest.raises(HaloError, match="without a scheme or credentials"):
        parse_registry("https://user:pw@public.ecr.aws/alias")
    with pytest.raises(HaloError, match=r"digest must be sha256:<64 hex>"):
        parse_ref("127.0.0.1:5000/h@sha256:abc")


class Gate:
    """A Bearer-token gate in front of a registry, on 127.0.0.1 (a real HTTP server)."""

    def __init__(self, upstream: str, user: str, password: str) -> None:
        self.upstream, self.tokens = upstream, {}  # token -> scope granted
        self.basic = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        gate = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _token(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                scopes = query.get("scope", [])
                wants_push = any(s.endswith("push") for s in scopes)
                if wants_push and self.headers.get("Authorization") != gate.basic:
                    return self._send(
                        401, b'{"errors":[{"code":"DENIED","message":"bad credentials"}]}'
                    )
                token = secrets.token_hex(8)
                gate.tokens[token] = " ".join(scopes)
                self._send(200, json.dumps({"token": token}).encode())

            def _send(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _proxy(self) -> None:
                if self.path.startswith("/token"):
                    return self._token()
                token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                granted = gate.tokens.get(token, "")
                needed = "push" if self.command in ("POST", "PUT", "PATCH") else "pull"
                if self.path.startswith("/v2/") and self.path != "/v2/" and needed not in granted:
                    name = self.path[4:].split("/manifests/")[0].split("/blobs/")[0]
                    realm = f"http://{self.headers['Host']}/token"
                    scope = f"repository:{name}:{'pull,push' if needed == 'push' else 'pull'}"
                    challenge = f'Bearer realm="{realm}",service="gate",scope="{scope}"'
                    return self._send(401, b"{}", {"WWW-Authenticate": challenge})
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection(gate.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "authorization"}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _proxy  # noqa: N815

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def ns() -> Iterator[Namespace]:
    yield from namespace()


@pytest.fixture
def gate(ns: Namespace) -> Iterator[Gate]:
    g = Gate(registry_address(), "AWS", secrets.token_hex(8))
    g.thread.start()
    yield g
    g.server.shutdown()


def _manifest() -> tuple[Manifest, bytes]:
    config = b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}'
    digest = "sha256:" + hashlib.sha256(config).hexdigest()
    body = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": digest,
                "size": len(config),
            },
            "layers": [],
        }
    ).encode()
    return Manifest(body, OCI_MANIFEST), config


def test_bearer_challenges_push_with_docker_credentials_and_pull_anonymously(
    gate: Gate, ns: Namespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest, config = _manifest()
    repo = Repo(gate.host, f"{ns.prefix}/gated/halo")
    ns.repos.add(repo.path)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))

    # No credentials: pulls work (anonymous tokens), pushes are refused with one line.
    anon = Registry(gate.host, anonymous=True)
    assert anon.get_manifest(repo, "cpu") is None
    with pytest.raises(HaloError, match=r"token for repository:.*:pull,push refused anonymously"):
        anon.upload_blob(repo, manifest.json["config"]["digest"], len(config), io.BytesIO(config))

    # docker's stored credentials answer the push challenge.
    auth = base64.b64encode(f"AWS:{_password(gate)}".encode()).decode()
    (tmp_path / "config.json").write_text(json.dumps({"auths": {gate.host: {"auth": auth}}}))
    pusher = Registry(gate.host)
    pusher.upload_blob(repo, manifest.json["config"]["digest"], len(config), io.BytesIO(config))
    assert pusher.put_manifest(repo, "cpu", manifest) == manifest.digest
    ns.untagged.setdefault(repo.path, set()).add(manifest.digest)

    # Anyone can now pull it, by tag and by digest, with a token and no credentials.
    pulled = Registry(gate.host, anonymous=True).get_manifest(repo, manifest.digest)
    assert pulled is not None and pulled.digest == manifest.digest
    assert "push" not in list(gate.tokens.values())[-1], "the last token was a pull token"


def _password(gate: Gate) -> str:
    return base64.b64decode(gate.basic.split()[1]).decode().split(":", 1)[1]
