"""Names from files a user did not write stay inside their folder (held-out fault class).

A seed list, a lock and a source archive each name files relative to a folder. Every case
here names one that is absolute, holds ``..``, or goes through a symlink out of the folder;
each must be one line, exit 2, and nothing written outside (nor, for the seed list and the
lock, anything written at all). The first case is the audit's: a seed list under HF_HOME's
default that overwrote ``~/.bashrc``.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from support import COPY_IGNORE, REPO, tree_listing

from halo.confine import inside, name_problem
from halo.errors import HaloError

REV = "0" * 40
EVIL = b"echo pwned\n"
ORIGINAL = b"# my shell settings\n"


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "halo", *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _one_line(proc: subprocess.CompletedProcess[str], starts: str) -> str:
    shown = f"exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
    assert proc.returncode == 2, shown
    assert "Traceback" not in proc.stdout + proc.stderr, shown
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"halo: error: {starts}"), shown
    return lines[0]


# --- seed lists -------------------------------------------------------------------------------


def _seed_case(tmp_path: Path, name: str) -> tuple[Path, dict[str, str]]:
    """A temp HOME with a ~/.bashrc, HF_HOME left at its default, and a seed list whose one file
    is ``name``, found under a ``local`` folder five levels deep with the matching sha256."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_bytes(ORIGINAL)
    lists = tmp_path / "lists"
    local = lists / "a" / "b" / "c" / "d" / "e"
    local.mkdir(parents=True)
    (tmp_path / ".bashrc").write_bytes(EVIL)  # local/../../../../../../.bashrc reads this
    (local / "x").mkdir()
    (local / "x" / "f").write_bytes(EVIL)
    digest = hashlib.sha256(EVIL).hexdigest()
    lst = lists / "seed.toml"
    lst.write_text(
        f'[[model]]\nid = "org/name"\nrevision = "{REV}"\nlocal = "a/b/c/d/e"\n'
        f'files = {{{_toml_str(name)} = "{digest}"}}\n'
    )
    env = {"HOME": str(home), "HF_HOME": "", "HF_HUB_CACHE": "", "HF_HUB_OFFLINE": "1"}
    return lst, env


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


SEED_NAMES = {
    "the-audit-case": "../../../../../../.bashrc",
    "dotdot-in-the-middle": "x/../../../../../../../.bashrc",
    "absolute": "/etc/halo-test-absolute",
    "backslashes": "..\\..\\..\\..\\..\\..\\.bashrc",
    "empty": "",
    "only-a-dot": ".",
}


@pytest.mark.parametrize("case", sorted(SEED_NAMES))
def test_a_seed_list_naming_a_file_outside_the_cache_is_refused(tmp_path: Path, case: str) -> None:
    lst, env = _seed_case(tmp_path, SEED_NAMES[case])
    before = tree_listing(tmp_path)
    proc = _run(["hf-cache", "seed", str(lst)], tmp_path, env)
    line = _one_line(proc, f"{lst}: model[0] (org/name): files: ")
    assert "refused" in line
    assert (tmp_path / "home" / ".bashrc").read_bytes() == ORIGINAL
    assert tree_listing(tmp_path) == before, "something was written"


def test_a_seed_list_file_reached_through_a_symlink_out_of_the_cache_is_refused(
    tmp_path: Path,
) -> None:
    """The cache already holds a link (a earlier seed, a shared cache) that leads out of it."""
    lst, env = _seed_case(tmp_path, "x/f")
    snap = tmp_path / "home" / ".cache" / "huggingface" / "hub" / "models--org--name"
    snap = snap / "snapshots" / REV
    snap.mkdir(parents=True)
    (snap / "x").symlink_to(tmp_path / "home")  # snapshot/x/f would be ~/f
    before = tree_listing(tmp_path)
    proc = _run(["hf-cache", "seed", str(lst)], tmp_path, env)
    line = _one_line(proc, f"{lst}: model[0] (org/name): files: 'x/f' resolves through a symlink")
    assert str(tmp_path / "home" / "f") in line
    assert tree_listing(tmp_path) == before


@pytest.mark.parametrize(
    ("field", "value"),
    [("revision", "/../../../../x"), ("revision", REV[:-3] + "/.."), ("id", "../../../x")],
)
def test_a_seed_list_whose_revision_or_id_would_form_a_path_out_is_refused(
    tmp_path: Path, field: str, value: str
) -> None:
    lst, env = _seed_case(tmp_path, "x/f")
    text = lst.read_text()
    text = re.sub(rf'^{field} = ".*"$', f"{field} = {_toml_str(value)}", text, flags=re.M)
    lst.write_text(text)
    before = tree_listing(tmp_path)
    proc = _run(["hf-cache", "seed", str(lst)], tmp_path, env)
    _one_line(proc, f"{lst}: ")
    assert tree_listing(tmp_path) == before


def test_a_good_seed_list_still_places_its_file(tmp_path: Path) -> None:
    """The refusals above are not a seeder that refuses everything."""
    lst, env = _seed_case(tmp_path, "x/f")
    proc = _run(["hf-cache", "seed", str(lst)], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    placed = tmp_path / "home/.cache/huggingface/hub/models--org--name/snapshots" / REV / "x/f"
    assert placed.read_bytes() == EVIL
    assert (tmp_path / "home" / ".bashrc").read_bytes() == ORIGINAL


# --- locks ------------------------------------------------------------------------------------

LOCK_PATHS = {
    "dotdot": "../x-1.0-py3-none-any.whl",
    "dotdot-below-wheels": "wheels/../../x-1.0-py3-none-any.whl",
    "absolute": "/tmp/x-1.0-py3-none-any.whl",
    "a-subfolder": "wheels/sub/x-1.0-py3-none-any.whl",
    "backslash": "wheels/..\\..\\x-1.0-py3-none-any.whl",
    "hidden": "wheels/.x-1.0-py3-none-any.whl",
}


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("lock") / "repo"
    shutil.copytree(REPO, repo, ignore=COPY_IGNORE)
    return repo


@pytest.mark.parametrize("case", sorted(LOCK_PATHS))
def test_a_lock_naming_a_file_outside_its_folder_is_refused(
    tmp_path: Path, repo_copy: Path, case: str
) -> None:
    lock = repo_copy / "pins" / "pylock.cpu.toml"
    good = lock.read_text()
    first = re.search(r'^path = "(wheels/[^"]+)"$', good, flags=re.M)
    assert first is not None
    try:
        lock.write_text(good.replace(first.group(0), f"path = {_toml_str(LOCK_PATHS[case])}", 1))
        env = {
            "HALO_STORE": str(tmp_path / "store"),
            "HALO_SUBSTITUTES": str(tmp_path / "subst"),
            "HALO_INDEX_URL": "http://127.0.0.1:9/simple/",
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "PIP_CONFIG_FILE": "/dev/null",
        }
        (tmp_path / "subst").mkdir()
        proc = _run(["fetch", "cpu"], repo_copy, env)
        line = _one_line(proc, f"{lock}: 1 problem: packages[0].wheels[0].path: ")
        assert "wheels/" in line
        assert tree_listing(tmp_path) == ["subst"], "something was written"
    finally:
        lock.write_text(good)


def test_the_stager_confines_a_lock_it_did_not_read_itself(tmp_path: Path) -> None:
    """A Lock made in code (not parsed) with such a name: the stager refuses it too."""
    from halo.pins.lockfile import Artifact, Lock, Package
    from halo.stack.stage import stage_wheels
    from halo.store.store import Store

    art = Artifact("../escape.whl", "0" * 64, 1)
    pip = Artifact("pip-24.0-py3-none-any.whl", "1" * 64, 1)
    lock = Lock(
        "t", "3.11", "x", "0" * 64, (Package("pip", "24.0", (pip,)), Package("x", "1", (art,)))
    )
    with pytest.raises(
        HaloError,
        match=r"^pins/pylock\.t\.toml: packages: '\.\./escape\.whl': '\.\.' in it; refused",
    ):
        stage_wheels(tmp_path / "wheels", lock, Store(tmp_path / "store"))
    assert not (tmp_path / "escape.whl").exists()


# --- archives ---------------------------------------------------------------------------------


def _tar(path: Path, members: list[tuple[str, str, str | bytes]]) -> Path:
    """(name, kind, payload): kind "file" (bytes), "dir", "symlink"/"hardlink" (target), "chr", "fifo"."""
    with tarfile.open(path, "w:gz") as tf:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            data = None
            if kind == "file":
                assert isinstance(payload, bytes)
                info.size, data = len(payload), io.BytesIO(payload)
            elif kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif kind in ("symlink", "hardlink"):
                info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                info.linkname = str(payload)
            elif kind == "chr":
                info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            tf.addfile(info, data)
    return path


ARCHIVES: dict[str, list[tuple[str, str, str | bytes]]] = {
    "dotdot": [("src/ok.txt", "file", b"ok"), ("../escaped.txt", "file", b"x")],
    "dotdot-inside-a-name": [("src/../../escaped.txt", "file", b"x")],
    "absolute": [("src/ok.txt", "file", b"ok"), ("/tmp/halo-test-escaped.txt", "file", b"x")],
    "symlink-out-then-a-file-through-it": [
        ("src/ok.txt", "file", b"ok"),
        ("src/out", "symlink", "../../.."),
        ("src/out/escaped.txt", "file", b"x"),
    ],
    "symlink-absolute": [("src/etc", "symlink", "/etc")],
    "symlink-through-a-symlink": [
        ("src/d/e", "dir", ""),
        ("src/d/e/up", "symlink", "../../.."),  # lexically inside: the root
        ("src/up2", "symlink", "d/e/up/.."),
        ("src/up2/escaped.txt", "file", b"x"),
    ],
    "hardlink-out": [("src/passwd", "hardlink", "/etc/passwd")],
    "hardlink-dotdot": [("src/x", "hardlink", "../escaped.txt")],
    "device": [("src/null", "chr", "")],
    "fifo": [("src/pipe", "fifo", "")],
}


@pytest.mark.parametrize("case", sorted(ARCHIVES))
def test_a_source_archive_with_a_member_outside_its_tree_is_refused(
    tmp_path: Path, case: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    archive = _tar(tmp_path / "src.tar.gz", ARCHIVES[case])
    before = tree_listing(tmp_path)
    proc = _run(["pins", "source-hash", str(archive)], work, {"TMPDIR": str(work)})
    line = _one_line(proc, f"{archive}: member ")
    assert "refused" in line
    assert tree_listing(tmp_path) == before, "something was left outside the unpacking folder"
    assert not Path("/tmp/halo-test-escaped.txt").exists()


def test_a_zip_with_a_member_outside_its_tree_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "src.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("src/ok.txt", b"ok")
        zf.writestr("src/../../escaped.txt", b"x")  # zipfile would quietly rename it
    work = tmp_path / "work"
    work.mkdir()
    proc = _run(["pins", "source-hash", str(archive)], work, {"TMPDIR": str(work)})
    _one_line(proc, f"{archive}: member 'src/../../escaped.txt': '..' in it; refused")
    assert tree_listing(work) == []


def test_a_clean_archive_still_hashes(tmp_path: Path) -> None:
    archive = _tar(
        tmp_path / "src.tar.gz",
        [
            ("src/a.txt", "file", b"a"),
            ("src/link", "symlink", "a.txt"),
            ("src/h", "hardlink", "src/a.txt"),
        ],
    )
    proc = _run(["pins", "source-hash", str(archive)], tmp_path, {})
    assert proc.returncode == 0 and re.fullmatch(r"[0-9a-f]{64}\n", proc.stdout), proc.stderr


# --- the helper itself ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../x", "'..' in it"),
        ("a/../../x", "'..' in it"),
        ("/x", "an absolute path"),
        ("", "an empty name"),
        (".", "names the folder itself, not a file in it"),
        ("a\\b", "a backslash in it (names use '/')"),
        ("a\x00b", "a NUL byte in it"),
    ],
)
def test_name_problem(name: str, why: str) -> None:
    assert name_problem(name) == why


def test_inside_follows_links_already_on_disk(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    (folder / "in").mkdir(parents=True)
    (folder / "up").symlink_to(tmp_path)
    (folder / "sideways").symlink_to(folder / "in")
    assert inside(folder, "in/x", "t") == folder / "in" / "x"
    assert inside(folder, "sideways/x", "t") == folder / "sideways" / "x"
    with pytest.raises(HaloError, match=r"^t: 'up/x' resolves through a symlink to .*, outside "):
        inside(folder, "up/x", "t")
