"""Source trees in the store: from substitutes or a (local, real HTTP) archive download, trusted
only through the pinned content hashes, only the pinned part kept, hashed again on every use."""

from __future__ import annotations

import http.server
import io
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from halo.errors import HaloError
from halo.hashing import sha256_tree
from halo.pins.source_pins import SourcePin, Submodule
from halo.store.index import IndexClient
from halo.store.sources import source_tree, stored_tree, tree_path
from halo.store.store import Store

MAIN = "1" * 40
SUB = "2" * 40


def tarball(files: dict[str, str], prefix: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{prefix}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tree_hash(tmp: Path, files: dict[str, str]) -> str:
    root = tmp / f"h{len(list(tmp.iterdir()))}"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return sha256_tree(root)


MAIN_FILES = {"setup.py": "print('build')\n", "src/a.c": "int a;\n"}
SUB_FILES = {"include/x.h": "#define X 1\n", "docs/big.md": "not built\n"}


@pytest.fixture
def pin(tmp_path: Path) -> SourcePin:
    scratch = tmp_path / "hashes"
    scratch.mkdir()
    return SourcePin(
        name="demo",
        distribution="demo",
        version="1.0",
        repository="http://127.0.0.1:9/owner/demo",
        commit=MAIN,
        content_sha256=tree_hash(scratch, MAIN_FILES),
        sets=("cpu",),
        submodules=(
            Submodule(
                "third/sub",
                "http://127.0.0.1:9/owner/sub",
                SUB,
                tree_hash(scratch, {"x.h": SUB_FILES["include/x.h"]}),
                "include",
            ),
        ),
    )


@pytest.fixture
def substitutes(tmp_path: Path) -> Path:
    folder = tmp_path / "subs"
    folder.mkdir()
    (folder / f"{MAIN}.tar.gz").write_bytes(tarball(MAIN_FILES, f"demo-{MAIN}"))
    (folder / f"{SUB}.tar.gz").write_bytes(tarball(SUB_FILES, f"sub-{SUB}"))
    return folder


def no_download(url: str):  # type: ignore[no-untyped-def]
    raise AssertionError(f"downloaded {url}")


def test_substitutes_are_used_verified_and_only_the_pinned_part_is_kept(
    pin: SourcePin, substitutes: Path, tmp_path: Path
) -> None:
    store = Store(tmp_path / "store")
    tree = source_tree(pin, store, tmp_path / "work", [substitutes], no_download)
    assert tree == tree_path(store, pin)
    assert (tree / "setup.py").is_file() and (tree / "third/sub/include/x.h").is_file()
    assert not (tree / "third/sub/docs").exists()  # outside the submodule's pinned include/
    assert source_tree(pin, store, tmp_path / "work", [], no_download) == tree  # reused


def test_a_stored_tree_that_changed_is_fetched_again(
    pin: SourcePin, substitutes: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(tmp_path / "store")
    tree = source_tree(pin, store, tmp_path / "work", [substitutes], no_download)
    (tree / "src" / "a.c").write_text("int a = 666;\n")
    assert stored_tree(pin, store) is None
    assert "demo: content hash" in capsys.readouterr().err
    again = source_tree(pin, store, tmp_path / "work", [substitutes], no_download)
    assert (again / "src" / "a.c").read_text() == "int a;\n"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, dict[str, bytes]]]:
    """A real HTTP server for ``/owner/NAME/archive/COMMIT.tar.gz``."""
    archives: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = archives.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", archives
    httpd.shutdown()


def _served(pin: SourcePin, base: str) -> SourcePin:
    sub = pin.submodules[0]
    return SourcePin(
        **{
            **pin.__dict__,
            "repository": f"{base}/owner/demo",
            "submodules": (
                Submodule(
                    sub.path, f"{base}/owner/sub", sub.commit, sub.content_sha256, sub.subdirectory
                ),
            ),
        }
    )


def test_a_wrong_substitute_is_refused_and_the_download_is_verified(
    pin: SourcePin,
    tmp_path: Path,
    server: tuple[str, dict[str, bytes]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    base, archives = server
    pin = _served(pin, base)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / f"{MAIN}.tar.gz").write_bytes(tarball({**MAIN_FILES, "extra.txt": "x"}, "demo"))
    archives[f"/owner/demo/archive/{MAIN}.tar.gz"] = tarball(MAIN_FILES, f"demo-{MAIN}")
    archives[f"/owner/sub/archive/{SUB}.tar.gz"] = tarball(SUB_FILES, f"sub-{SUB}")
    store = Store(tmp_path / "store")
    tree = source_tree(pin, store, tmp_path / "work", [bad], IndexClient.download)
    assert "refused substitute" in capsys.readouterr().err
    assert not (tree / "extra.txt").exists() and (tree / "third/sub/include/x.h").is_file()

    # A download whose content is not the pinned one: one line, nothing kept.
    archives[f"/owner/demo/archive/{MAIN}.tar.gz"] = tarball({"setup.py": "evil\n"}, "demo")
    fresh = Store(tmp_path / "fresh")
    with pytest.raises(HaloError) as err:
        source_tree(pin, fresh, tmp_path / "work", [], IndexClient.download)
    assert err.value.message.startswith(f"demo: source of {MAIN}: content hash ")
    assert err.value.message.endswith(f"pin says {pin.content_sha256}; not kept")
    assert not tree_path(fresh, pin).exists()
