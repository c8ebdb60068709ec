"""URLs with credentials (held-out fault class: leaks).

``http://user:TOKEN@host/…`` must never be sent with ``user:TOKEN@host`` as the host name:
its userinfo arrives as an ``Authorization: Basic`` header (checked on a real HTTP server
here), or the URL is refused in one line. A query that carries a key (``?api_key=…``) is
sent where it can be and never shown. Whatever happens, no output (stdout, stderr, files
written) holds the token.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import COPY_IGNORE, REPO

from halo.pins.lockfile import Artifact, Lock, Package
from halo.rollout.client import Client, Retry, RolloutError
from halo.sources import index_urls
from halo.store.fetch import fetch_lock
from halo.store.index import IndexClient
from halo.store.store import Store

# Made per run, so no file (this one included) holds them unless a run leaked them there.
TOKEN = f"tok-{secrets.token_hex(8)}"
KEY = f"key-{secrets.token_hex(8)}"
BASIC = "Basic " + base64.b64encode(f"user:{TOKEN}".encode()).decode()


class Recorder:
    """A real HTTP server on 127.0.0.1 that records every request's path and Authorization.

    ``pages`` maps a path (query stripped) to (status, JSON body); anything else is 404.
    """

    def __init__(self) -> None:
        self.pages: dict[str, tuple[int, object]] = {}
        self.files: dict[str, bytes] = {}
        self.seen: list[tuple[str, str | None]] = []
        rec = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self) -> None:
                rec.seen.append((self.path, self.headers.get("Authorization")))
                path = self.path.split("?", 1)[0]
                if path in rec.files:
                    body, code, ctype = rec.files[path], 200, "application/octet-stream"
                else:
                    code, obj = rec.pages.get(path, (404, {"error": "not found"}))
                    body, ctype = json.dumps(obj).encode(), "application/vnd.pypi.simple.v1+json"
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self._answer()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def base(self, userinfo: str = f"user:{TOKEN}") -> str:
        return f"http://{userinfo}@127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    yield rec
    rec.close()


def _no_secret(*texts: str, under: Path | None = None) -> None:
    for text in texts:
        assert TOKEN not in text and KEY not in text, text
    if under is not None:
        for path in under.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                assert TOKEN.encode() not in data and KEY.encode() not in data, path


def _halo(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_", "HALO_"))}
    return subprocess.run(
        [sys.executable, "-m", "halo", *argv],
        cwd=cwd,
        env={**base, "PYTHONPATH": str(REPO), "PIP_CONFIG_FILE": "/dev/null", **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    shown = f"exit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, shown
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("halo: error: ")]
    assert len(errors) == 1 and proc.stderr.strip().splitlines()[-1] == errors[0], shown
    return errors[0]


# --- the index: fetch (our own HTTP) ------------------------------------------------------------


def _demo(rec: Recorder) -> tuple[Lock, bytes]:
    data = b"demo wheel bytes" * 100
    sha = hashlib.sha256(data).hexdigest()
    name = "demo-1.0-py3-none-any.whl"
    rec.files[f"/files/{name}"] = data
    rec.pages["/simple/demo/"] = (
        200,
        {"meta": {"api-version": "1.0"}, "name": "demo", "files": [
            {"filename": name, "url": f"/files/{name}", "hashes": {"sha256": sha}}
        ]},
    )  # fmt: skip
    pkg = Package("demo", "1.0", (Artifact(name, sha, len(data)),))
    return Lock("t", "3.11", "x86_64-manylinux_2_36", "0" * 64, (pkg,)), data


def test_fetch_sends_an_index_urls_userinfo_as_a_header(
    tmp_path: Path, recorder: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    lock, data = _demo(recorder)
    urls = index_urls(
        {"HALO_INDEX_URL": recorder.base() + "/simple/", "PIP_CONFIG_FILE": os.devnull}
    )
    store = Store(tmp_path / "store")
    fetch_lock(lock, store, IndexClient(urls), [])
    assert store.path(lock.packages[0].artifacts[0].sha256).read_bytes() == data
    assert recorder.seen == [("/simple/demo/", BASIC), ("/files/demo-1.0-py3-none-any.whl", BASIC)]
    out = capsys.readouterr()
    _no_secret(out.out, out.err, under=tmp_path)


@pytest.mark.parametrize("answer", ["http-500", "http-401", "not-json", "nothing-listens"])
def test_halo_fetch_with_a_credential_in_the_index_url_never_shows_it(
    tmp_path: Path, recorder: Recorder, answer: str
) -> None:
    """The audit's case: the error line showed ``user:TOKEN@host`` as a host name."""
    url = recorder.base() + "/simple/"
    if answer == "nothing-listens":
        url = f"http://user:{TOKEN}@127.0.0.1:9/simple/"
    given = {"http-500": (500, {"e": 1}), "http-401": (401, {"e": 1})}.get(answer, (200, [1]))

    class Every(dict):  # every project page gives the same answer
        def get(self, key, default=None):  # type: ignore[no-untyped-def, override]
            return given

    recorder.pages = Every()
    env = {
        "HALO_INDEX_URL": url,
        "HALO_STORE": str(tmp_path / "store"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "HALO_SUBSTITUTES": "",
    }
    proc = _halo(["fetch", "cpu"], REPO, env)
    line = _one_line(proc)
    _no_secret(proc.stdout, proc.stderr, under=tmp_path)
    assert "@" not in line, line
    if answer != "nothing-listens":
        assert recorder.seen and all(auth == BASIC for _, auth in recorder.seen)
        assert all(TOKEN not in path for path, _ in recorder.seen)


# The token goes in when the test runs, not into the parameters: their ids are the test's
# name, which must be the same in every pytest-xdist worker (and from one run to the next).
@pytest.mark.parametrize(
    ("var", "url"),
    [
        ("HALO_INDEX_URL", "http://127.0.0.1:9/simple/?token=TOKEN"),
        ("HALO_INDEX_URL", "http://127.0.0.1:9/simple/#TOKEN"),
        ("HALO_INDEX_URL", "ftp://user:TOKEN@127.0.0.1/simple/"),
        ("HALO_INDEX_URL", "http://user:TOKEN@127.0.0.1:notaport/simple/"),
        ("PIP_INDEX_URL", "http://127.0.0.1:9/simple?api_key=TOKEN"),
        ("HALO_EXTRA_INDEX_URLS", "http://127.0.0.1:9/extra/?key=TOKEN"),
    ],
)
def test_an_index_url_that_cannot_be_used_is_refused_in_one_line_without_its_token(
    tmp_path: Path, var: str, url: str
) -> None:
    url = url.replace("TOKEN", TOKEN)
    env = {var: url, "HALO_STORE": str(tmp_path / "store"), "XDG_CACHE_HOME": str(tmp_path / "c")}
    proc = _halo(["fetch", "cpu"], REPO, env)
    line = _one_line(proc)
    assert line.startswith("halo: error: $"), line
    _no_secret(proc.stdout, proc.stderr, under=tmp_path)
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("*.whl"))


# --- the index: uv resolution -----------------------------------------------------------------


def test_pins_lock_hands_uv_the_credential_as_a_header_and_never_shows_it(
    tmp_path: Path, recorder: Recorder
) -> None:
    if shutil.which("uv") is None:
        pytest.skip("needs uv on PATH (the toolchain installs it)")
    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo, ignore=COPY_IGNORE)
    lock = repo / "pins" / "pylock.cpu.toml"
    before = lock.read_bytes()
    env = {
        "HALO_INDEX_URL": recorder.base() + "/simple/",
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "HALO_SUBSTITUTES": "",
    }
    proc = _halo(["pins", "lock", "cpu"], repo, env)  # the index has no projects: uv fails
    line = _one_line(proc)
    assert "uv could not resolve it" in line, line
    _no_secret(proc.stdout, proc.stderr, under=tmp_path)
    assert lock.read_bytes() == before
    assert recorder.seen, "uv never asked the index"
    assert all(auth == BASIC for _, auth in recorder.seen), recorder.seen[:3]


def test_uv_gets_credentials_through_its_own_variables_not_argv() -> None:
    from halo.pins.resolve import uv_indexes

    args, env = uv_indexes([f"https://user:{TOKEN}@h.invalid/simple/", "https://other.invalid/s/"])
    assert args == ["halo0=https://h.invalid/simple/", "https://other.invalid/s/"]
    assert env == {"UV_INDEX_HALO0_USERNAME": "user", "UV_INDEX_HALO0_PASSWORD": TOKEN}


# --- the rollout client -------------------------------------------------------------------------


def _completions(rec: Recorder, code: int = 200) -> None:
    choice = {"index": 0, "token_ids": [1, 2], "text": "hi", "finish_reason": "stop"}
    rec.pages["/v1/completions"] = (code, {"choices": [choice]} if code == 200 else {"e": 1})


def test_the_rollout_client_sends_userinfo_as_a_header_and_the_query_along(
    recorder: Recorder,
) -> None:
    _completions(recorder)
    client = Client(recorder.base() + f"/?api_key={KEY}", "m", timeout_s=5)
    (group,) = client.complete([[1]], 1, 4, 1.0, seed=0)
    assert group[0].token_ids == (1, 2)
    assert recorder.seen == [(f"/v1/completions?api_key={KEY}", BASIC)]
    _no_secret(client.shown, repr(client))


@pytest.mark.parametrize("answer", ["http-500", "http-400", "nothing-listens"])
def test_a_rollout_failure_never_shows_the_credential(recorder: Recorder, answer: str) -> None:
    _completions(recorder, 500 if answer == "http-500" else 400)
    base = recorder.base() if answer != "nothing-listens" else f"http://user:{TOKEN}@127.0.0.1:9"
    client = Client(base + f"?api_key={KEY}", "m", timeout_s=5)
    said: list[str] = []
    with pytest.raises(RolloutError) as err:
        Retry(2, 0.0, say=said.append)("rollout", lambda: client.complete([[1]], 1, 4, 1.0, 0))
    _no_secret(err.value.message, *said)
    assert f"POST http://127.0.0.1:{base.rsplit(':', 1)[1]}/v1/completions" in err.value.message


def test_serve_status_shows_a_rollout_url_without_its_credentials(
    tmp_path: Path, recorder: Recorder
) -> None:
    recorder.pages["/health"] = (200, {})
    env = {
        "HALO_VLLM_URL": recorder.base() + f"?api_key={KEY}",
        "HALO_SGLANG_URL": f"http://user:{TOKEN}@127.0.0.1:9/?api_key={KEY}",
        "HALO_SCRATCH": str(tmp_path / "scratch"),
    }
    proc = _halo(["serve", "status"], REPO, env)
    assert proc.returncode == 0, proc.stderr
    _no_secret(proc.stdout, proc.stderr, under=tmp_path)
    row = next(ln for ln in proc.stdout.splitlines() if ln.startswith("vllm"))
    assert re.search(rf"http://127\.0\.0\.1:{recorder.port}\s+answers", row), proc.stdout
    assert recorder.seen == [(f"/health?api_key={KEY}", BASIC)]
