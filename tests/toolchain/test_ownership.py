"""`halo test --user`: what a tier wrote under scratch must be that user's (halo.testing.ownership)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from halo.testing.container import USER_DIRS, prepare_scratch
from halo.testing.ownership import foreign_writes, parse_user

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown files to others")


def test_user_strings() -> None:
    assert parse_user("1000:1000") == (1000, 1000)
    assert parse_user("1000") == (1000, None)


@needs_root
def test_only_what_changed_since_the_start_and_is_not_the_users_is_named(tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.write_text("before the run")  # root's, but older than the run: not named
    os.utime(old, ns=(1, 1))
    since = time.time_ns()
    mine, theirs = tmp_path / "mine", tmp_path / "sub" / "theirs"
    theirs.parent.mkdir()
    os.chown(theirs.parent, 1000, 1000)
    mine.write_text("x")
    os.chown(mine, 1000, 1000)
    theirs.write_text("x")  # root's, written during the run
    assert foreign_writes(tmp_path, since, 1000, 1000) == [theirs]
    os.chown(theirs, 1000, 2000)
    assert foreign_writes(tmp_path, since, 1000, 1000) == [theirs]  # the group counts too
    assert foreign_writes(tmp_path, since, 1000, None) == []


@needs_root
def test_scratch_run_folders_are_handed_to_the_user_and_the_cache_is_not(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)  # as mktemp -d makes it (CI's scratch): the user must pass through
    prepare_scratch(tmp_path, "1000:1001")
    assert tmp_path.stat().st_mode & 0o777 == 0o711
    for sub in (*USER_DIRS, "home/1000", "tmp/1000"):  # HOME and TMPDIR: the user's own
        st = (tmp_path / sub).stat()
        assert (st.st_uid, st.st_gid) == (1000, 1001), sub
    assert (tmp_path / "hf").stat().st_uid == 0  # seeded by the host, only read in there
    prepare_scratch(tmp_path / "plain")
    assert (tmp_path / "plain" / "tmp").stat().st_uid == 0
