"""The assembler's layer diff (halo.images.realise.assemble): what a step wrote or removed
under the staged root becomes the next layer; bytecode never does."""

from __future__ import annotations

import tarfile
from pathlib import Path

from halo.images.realise.assemble import changed_since, snapshot, write_layer


def _tree(root: Path) -> None:
    site = root / "opt/venv/lib/python3.11/site-packages"
    (site / "_distutils_hack").mkdir(parents=True)
    (site / "_distutils_hack" / "__init__.py").write_text("x = 1\n")
    (site / "gone.py").write_text("y = 2\n")


def test_a_written_and_a_removed_file_are_the_change(tmp_path: Path) -> None:
    _tree(tmp_path)
    site = "opt/venv/lib/python3.11/site-packages"
    before = snapshot(tmp_path, "opt/venv")
    (tmp_path / site / "gone.py").unlink()
    (tmp_path / site / "new.py").write_text("z = 3\n")
    assert changed_since(tmp_path, "opt/venv", before) == [f"{site}/gone.py", f"{site}/new.py"]
    layer = write_layer(tmp_path, changed_since(tmp_path, "opt/venv", before),
                        tmp_path / "l.tar", 0, "test")  # fmt: skip
    with tarfile.open(layer.path) as tar:
        names = tar.getnames()
    assert f"{site}/.wh.gone.py" in names and f"{site}/new.py" in names


def test_bytecode_written_then_tidied_away_is_no_whiteout(tmp_path: Path) -> None:
    """A staged venv's python ran (site's .pth imports _distutils_hack) and left bytecode that
    tidy removed: as a whiteout in a folder that no layer holds, docker load failed
    ("failed to mknod(.../__pycache__/__init__.cpython-311.pyc): not a directory")."""
    _tree(tmp_path)
    cache = tmp_path / "opt/venv/lib/python3.11/site-packages/_distutils_hack/__pycache__"
    cache.mkdir()
    (cache / "__init__.cpython-311.pyc").write_bytes(b"\x00" * 16)
    before = snapshot(tmp_path, "opt/venv")
    for pyc in cache.iterdir():
        pyc.unlink()
    cache.rmdir()
    assert changed_since(tmp_path, "opt/venv", before) == []
    cache.mkdir()
    (cache / "__init__.cpython-311.pyc").write_bytes(b"\x00" * 16)
    assert changed_since(tmp_path, "opt/venv", before) == [], "nor is written bytecode layered"
