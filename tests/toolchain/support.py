"""Helpers shared by toolchain tests: run the CLI, list trees, a real local package index."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".nox", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", "*.egg-info"
)


def halo(
    *args: str, cwd: Path, env: dict[str, str] | None = None, umask: int = -1
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "halo", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
        umask=umask,
    )


def built_ref(stdout: str, repository: str = "halo", image: str = "cpu") -> str:
    """The immutable reference in `halo image build`'s result table (REPOSITORY:IMAGE-HASH):
    tests name it, never the moving tag, which builds side by side may move."""
    row = next(li for li in stdout.splitlines() if li.startswith(f"{repository}:{image} "))
    return f"{repository}:{row.split()[1]}"


def tree_listing(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []


class LocalIndex:
    """A real PEP 691 JSON index over HTTP on 127.0.0.1, serving files from a folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: dict[str, dict[str, bytes]] = {}
        # filename -> bytes actually sent before the connection drops (Content-Length stays full)
        self.cut_short: dict[str, int] = {}
        handler = self._handler()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/simple/"

    def add(
        self,
        project: str,
        filename: str,
        data: bytes,
        listed_sha256: str | None = None,
        upload_time: str | None = None,
    ) -> str:
        """Serve ``filename``; ``upload_time`` (PEP 700, ISO 8601) is what exclude-newer reads."""
        self.files.setdefault(project, {})[filename] = data
        self._listed = getattr(self, "_listed", {})
        self._listed[filename] = listed_sha256 or hashlib.sha256(data).hexdigest()
        self._uploaded = getattr(self, "_uploaded", {})
        if upload_time:
            self._uploaded[filename] = upload_time
        return hashlib.sha256(data).hexdigest()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                # uv probes wheels for range requests; no Accept-Ranges: it downloads them whole.
                self._head_only = True
                self.do_GET()

            def do_GET(self) -> None:
                parts = [p for p in self.path.split("/") if p]
                if len(parts) == 2 and parts[0] == "simple" and parts[1] in index.files:
                    uploaded = getattr(index, "_uploaded", {})
                    files = [
                        {
                            "filename": f,
                            "url": f"/files/{f}",
                            "hashes": {"sha256": index._listed[f]},
                            # PEP 700 fields, only where an upload time was given.
                            **(
                                {"upload-time": uploaded[f], "size": len(data)}
                                if f in uploaded
                                else {}
                            ),
                        }
                        for f, data in index.files[parts[1]].items()
                    ]
                    # PEP 700 (1.1) is the version that carries upload times.
                    api = "1.1" if any(f in uploaded for f in index.files[parts[1]]) else "1.0"
                    body = json.dumps(
                        {"meta": {"api-version": api}, "name": parts[1], "files": files}
                    ).encode()
                    self._send(200, body, "application/vnd.pypi.simple.v1+json")
                    return
                if len(parts) == 2 and parts[0] == "files":
                    for files in index.files.values():
                        if parts[1] in files:
                            body = files[parts[1]]
                            sent = index.cut_short.get(parts[1], len(body))
                            self._send(200, body, "application/octet-stream", sent)
                            return
                self._send(404, b"not found", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str, sent: int | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if getattr(self, "_head_only", False):
                    return
                self.wfile.write(body[:sent])
                if sent is not None and sent < len(body):
                    self.close_connection = True

        return Handler


def docker_or_skip():  # type: ignore[no-untyped-def]
    """The Docker engine, or a skip that says why there is none (never a pass)."""
    import pytest

    from halo.images.docker import Docker

    try:
        docker = Docker.discover()
        docker.ping()
    except Exception as exc:
        pytest.skip(f"needs a running Docker engine: {exc}")
    return docker


def linked_store(dest: Path, artifacts):  # type: ignore[no-untyped-def]
    """A store at ``dest`` holding ``artifacts`` as hard links into the real store.

    Cheap, and a test that then breaks an entry replaces the link, never the real bytes.
    """
    from halo.paths import store_root
    from halo.store.store import Store

    real, copy = Store(store_root()), Store(dest)
    for art in artifacts:
        copy.path(art.sha256).parent.mkdir(parents=True, exist_ok=True)
        os.link(real.path(art.sha256), copy.path(art.sha256))
    return copy
