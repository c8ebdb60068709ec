"""Where artifacts may come from is configuration: environment and pip's own config files."""

from __future__ import annotations

import os
from pathlib import Path

from halo.sources import index_urls, substitute_dirs


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home"), "XDG_CONFIG_DIRS": str(tmp_path / "xdg"), **extra}


def test_substitutes_from_env_and_pip_config_in_order(tmp_path: Path) -> None:
    a, b, c = (tmp_path / n for n in "abc")
    for d in (a, b, c):
        d.mkdir()
    conf = tmp_path / "home" / ".config" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(f"[global]\nfind-links = {c}\nextra-index-url = file:///nowhere\n")
    env = _env(
        tmp_path, HALO_SUBSTITUTES=str(a), PIP_FIND_LINKS=f"file://{b} https://remote/ignored"
    )
    assert substitute_dirs(env) == [a, b, c]


def test_pip_config_file_devnull_turns_pip_config_off_as_in_pip(tmp_path: Path) -> None:
    folder = tmp_path / "wheels"
    folder.mkdir()
    conf = tmp_path / "home" / ".config" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(f"[global]\nfind-links = {folder}\n")
    assert substitute_dirs(_env(tmp_path)) == [folder]
    assert substitute_dirs(_env(tmp_path, PIP_CONFIG_FILE=os.devnull)) == []


def test_missing_folders_and_remote_links_are_not_substitutes(tmp_path: Path) -> None:
    env = _env(
        tmp_path,
        HALO_SUBSTITUTES=str(tmp_path / "absent"),
        UV_FIND_LINKS="https://example.invalid/",
    )
    assert substitute_dirs(env) == []


def test_index_precedence_and_file_urls_skipped(tmp_path: Path) -> None:
    env = _env(
        tmp_path,
        HALO_INDEX_URL="http://127.0.0.1:1/simple",
        PIP_INDEX_URL="http://127.0.0.1:2/simple",
        HALO_EXTRA_INDEX_URLS="http://127.0.0.1:3/x file:///local",
    )
    assert index_urls(env) == ["http://127.0.0.1:1/simple/", "http://127.0.0.1:3/x/"]
    # With nothing configured, pip's own default is used (its location is not written in this repo).
    assert len(index_urls(_env(tmp_path))) == 1
