"""Fetch tries a request again when it failed in a way that passes (a name lookup that timed
out, a reset connection, an index's 429/5xx), and only then."""

from __future__ import annotations

import http.server
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from halo.store.index import transient, urlopen


def _http(code: int) -> urllib.error.HTTPError:
    return urllib.error.HTTPError("http://index.invalid/x/", code, "", {}, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("exc", "again"),
    [
        (urllib.error.URLError(socket.gaierror(socket.EAI_AGAIN, "Temporary failure")), True),
        (urllib.error.URLError(socket.gaierror(socket.EAI_NONAME, "Name not known")), False),
        (urllib.error.URLError(ConnectionRefusedError(111, "refused")), False),
        (ConnectionResetError(104, "reset"), True),
        (TimeoutError("timed out"), True),
        (_http(503), True),
        (_http(429), True),
        (_http(404), False),
        (_http(403), False),
    ],
)
def test_what_is_tried_again(exc: BaseException, again: bool) -> None:
    assert transient(exc) is again


@pytest.fixture
def flaky_index() -> Iterator[tuple[str, list[int]]]:
    """An index that answers 503 to its first request, then 200; the codes it sent."""
    sent: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = 503 if not sent else 200
            sent.append(code)
            self.send_response(code)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/x/", sent
    finally:
        server.shutdown()
        server.server_close()


def test_a_503_is_tried_again_and_then_answers(flaky_index: tuple[str, list[int]]) -> None:
    url, sent = flaky_index
    with urlopen(urllib.request.Request(url), delays=(0.0,)) as resp:
        assert resp.read() == b"ok"
    assert sent == [503, 200]


def test_without_tries_left_the_error_is_the_servers(flaky_index: tuple[str, list[int]]) -> None:
    url, sent = flaky_index
    with pytest.raises(urllib.error.HTTPError) as err:
        urlopen(urllib.request.Request(url), delays=())
    assert err.value.code == 503 and sent == [503]
