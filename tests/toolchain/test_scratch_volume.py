"""The scratch volume, found: halo.scratch.find_scratch over a given mount table and statvfs.

Every case hands find_scratch its inputs (a mountinfo text, a statvfs, the folder states):
nothing here depends on this machine's mounts, except the one smoke test that reads them.
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import REPO, halo

from halo.scratch import (
    SCRATCH_MIN_BYTES,
    ScratchChoice,
    find_scratch,
    parse_mountinfo,
    scratch_choice,
)

GB = 10**9
DEFAULT = Path("/home/ann/.cache/halo/scratch")
ROOT = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw"


def _line(n: int, point: str, fstype: str, device: str = "", opts: str = "rw") -> str:
    device = device or f"8:{n}"
    return f"{100 + n} 27 {device} / {point} {opts},relatime shared:{n} - {fstype} src{n} rw"


def _statvfs(sizes: dict[str, int]) -> Callable[[Path], SimpleNamespace]:
    """os.statvfs as the kernel would answer for these mount points (bytes available)."""

    def statvfs(path: Path) -> SimpleNamespace:
        if str(path) not in sizes:
            raise PermissionError(13, "Permission denied", str(path))
        return SimpleNamespace(f_bavail=sizes[str(path)] // 512, f_frsize=512)

    return statvfs


def _find(
    lines: list[str], sizes: dict[str, int], states: dict[str, str] | None = None
) -> ScratchChoice:
    states = states or {}
    return find_scratch(
        mountinfo="\n".join(lines) + "\n",
        statvfs=_statvfs(sizes),
        default=DEFAULT,
        user="ann",
        state=lambda p: states.get(str(p), "creatable"),
    )


def test_mountinfo_fields_escapes_and_optional_tags() -> None:
    text = (
        "36 35 98:0 /mnt1 /mnt/my\\040disk rw,noatime master:1 shared:4 - ext3 /dev/root rw\n"
        "not a mountinfo line\n"
        "37 35 98:1 / /ro ro,relatime - xfs /dev/sdb ro\n"
    )
    first, second = parse_mountinfo(text)
    assert (first.device, first.root, first.point, first.fstype, first.read_only) == (
        "98:0", "/mnt1", Path("/mnt/my disk"), "ext3", False,
    )  # fmt: skip
    assert second.read_only and second.point == Path("/ro")


@pytest.mark.parametrize(
    "fstype",
    ["tmpfs", "devtmpfs", "overlay", "squashfs", "nfs", "nfs4", "fuse", "fuse.sshfs", "fuseblk",
     "autofs"],
)  # fmt: skip
def test_each_skipped_type_loses_even_when_largest(fstype: str) -> None:
    lines = [ROOT, _line(1, "/big", fstype), _line(2, "/data", "xfs")]
    got = _find(lines, {"/": 25 * GB, "/big": 900 * GB, "/data": 300 * GB})
    assert got.path == Path("/data/halo-scratch-ann") and got.mount == Path("/data")
    assert not got.fallback and "300.0 GB" in got.why
    alone = _find([ROOT, _line(1, "/big", fstype)], {"/": 5 * GB, "/big": 900 * GB})
    assert alone.fallback and alone.path == DEFAULT
    assert f"skipped 1 {fstype}" in alone.why


def test_read_only_and_unmeasurable_mounts_are_passed_over() -> None:
    lines = [ROOT, _line(1, "/ro", "ext4", opts="ro"), _line(2, "/gone", "ext4")]
    got = _find(lines, {"/": 30 * GB, "/ro": 900 * GB})  # /gone: statvfs refuses
    assert got.path == DEFAULT and got.mount == Path("/") and not got.fallback


def test_the_largest_over_20_gb_wins_and_the_default_stays_where_it_is() -> None:
    lines = [ROOT, _line(1, "/mnt", "ext4"), _line(2, "/nvme", "xfs")]
    got = _find(lines, {"/": 40 * GB, "/mnt": 80 * GB, "/nvme": 1200 * GB})
    assert got.path == Path("/nvme/halo-scratch-ann") and got.available == 1200 * GB
    # The volume that holds the default: the default itself (the same space; nothing moves).
    home = _find(lines, {"/": 2000 * GB, "/mnt": 80 * GB, "/nvme": 1200 * GB})
    assert home.path == DEFAULT and home.mount == Path("/")


def test_exactly_20_gb_is_not_over_20_gb() -> None:
    got = _find([ROOT, _line(1, "/mnt", "ext4")], {"/": GB, "/mnt": SCRATCH_MIN_BYTES})
    assert got.fallback and "the largest: /mnt, 20.0 GB" in got.why


def test_a_tie_between_volumes_is_decided_the_same_way_every_time() -> None:
    sizes = {"/": 5 * GB, "/b/x": 500 * GB, "/a": 500 * GB, "/c": 500 * GB}
    lines = [ROOT, _line(1, "/c", "ext4"), _line(2, "/b/x", "ext4"), _line(3, "/a", "ext4")]
    assert _find(lines, sizes).mount == Path("/a")  # the shorter, then the smaller path
    assert _find(list(reversed(lines)), sizes).mount == Path("/a")
    # The holder of the default wins a tie: nothing moves.
    tie = _find([ROOT, _line(1, "/a", "ext4")], {"/": 500 * GB, "/a": 500 * GB})
    assert tie.path == DEFAULT


def test_a_bind_mount_of_the_same_disk_never_beats_the_whole_disk() -> None:
    # This machine kind's own table: / and two binds of folders of the same disk. Each is
    # measured once per disk, so the tie holds even while something writes to the disk.
    calls: list[str] = []
    sizes = {"/": 51 * GB, "/var/lib/docker": 51 * GB + 4096, "/run/netns": 51 * GB - 4096}

    def statvfs(path: Path) -> SimpleNamespace:
        calls.append(str(path))
        return _statvfs(sizes)(path)

    lines = [
        "45 27 254:0 /var/lib/docker /var/lib/docker rw,relatime shared:1 - ext4 /dev/vda rw",
        ROOT,
        "46 27 254:0 /run/netns /run/netns rw,relatime shared:2 - ext4 /dev/vda rw",
        _line(9, "/home", "nfs4"),  # the default's volume is not a candidate
    ]
    got = find_scratch("\n".join(lines), statvfs, DEFAULT, "ann", lambda p: "creatable")
    assert got.mount == Path("/") and got.path == Path("/halo-scratch-ann")
    assert calls == ["/var/lib/docker"]


def test_nothing_large_enough_falls_back_and_says_why() -> None:
    lines = [
        ROOT, _line(1, "/dev/shm", "tmpfs"), _line(2, "/mnt", "ext4"),
        _line(3, "/proc", "proc"), _line(4, "/media/x", "nfs4"),
    ]  # fmt: skip
    got = _find(lines, {"/": 12 * GB, "/dev/shm": 64 * GB, "/mnt": 3 * GB, "/proc": 0})
    assert got.fallback and got.path == DEFAULT and got.mount is None
    assert got.why == (
        "no local volume has over 20 GB available (the largest: /, 12.0 GB); "
        "skipped 1 nfs4, 1 tmpfs"
    )


def test_a_volume_this_user_cannot_write_is_named_and_the_next_one_taken() -> None:
    lines = [ROOT, _line(1, "/mnt", "ext4"), _line(2, "/data", "ext4"), _line(3, "/etc/x", "ext4")]
    sizes = {"/": 5 * GB, "/mnt": 900 * GB, "/data": 100 * GB, "/etc/x": 950 * GB}
    states = {"/mnt/halo-scratch-ann": "unusable", "/etc/x/halo-scratch-ann": "no-folder"}
    got = _find(lines, sizes, states)
    assert got.path == Path("/data/halo-scratch-ann")
    assert "/mnt/halo-scratch-ann is not writable for ann" in got.why and "/etc/x" not in got.why
    states["/data/halo-scratch-ann"] = "unusable"
    none = _find(lines, sizes, states)
    assert none.fallback and none.why.startswith("no volume over 20 GB is usable: ")


def test_a_scratch_in_use_does_not_move_when_another_volume_grows() -> None:
    lines = [ROOT, _line(1, "/mnt", "ext4"), _line(2, "/data", "ext4")]
    sizes = {"/": 5 * GB, "/mnt": 900 * GB, "/data": 100 * GB}
    got = _find(lines, sizes, {"/data/halo-scratch-ann": "present"})
    assert got.path == Path("/data/halo-scratch-ann") and "chosen before" in got.why
    # ... until it no longer has 20 GB.
    sizes["/data"] = 10 * GB
    assert _find(lines, sizes, {"/data/halo-scratch-ann": "present"}).mount == Path("/mnt")


def test_the_fallback_line_once_and_the_chosen_folder_made_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("HALO_SCRATCH", raising=False)
    lines = [ROOT, _line(1, "/mnt", "ext4")]

    def small() -> ScratchChoice:
        return _find(lines, {"/": 12 * GB, "/mnt": 3 * GB})

    for _ in range(3):
        assert scratch_choice(small).path == DEFAULT
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "halo: scratch: no local volume has over 20 GB available (the largest: /, 12.0 GB); "
        f"using {DEFAULT} (set HALO_SCRATCH to choose)"
    ]
    mount = tmp_path / "vol"
    mount.mkdir()
    line = _line(1, str(mount), "ext4")
    chosen = scratch_choice(
        lambda: find_scratch(f"{ROOT}\n{line}\n", _statvfs({str(mount): 99 * GB}), DEFAULT, "ann")
    )
    assert chosen.path == mount / "halo-scratch-ann" and chosen.path.is_dir()
    assert stat.S_IMODE(chosen.path.stat().st_mode) == 0o700
    assert capsys.readouterr().err == ""


def test_halo_scratch_set_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HALO_SCRATCH", str(tmp_path / "s"))

    def never() -> ScratchChoice:
        raise AssertionError("no mount is looked at when HALO_SCRATCH is set")

    got = scratch_choice(never)
    assert got.path == tmp_path / "s" and not (tmp_path / "s").exists()
    assert capsys.readouterr().err == ""
    proc = halo("paths", "scratch", "--why", cwd=REPO, env={"HALO_SCRATCH": str(tmp_path / "s")})
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == f"{tmp_path / 's'}\nwhy: set by HALO_SCRATCH\n"


@pytest.mark.skipif(not Path("/proc/self/mountinfo").exists(), reason="needs Linux's /proc")
def test_this_machines_mounts_give_an_answer_without_writing() -> None:
    got = find_scratch(state=lambda p: "creatable" if not p.exists() else "present")
    assert got.path.is_absolute() and got.why
    assert got.fallback or got.available > SCRATCH_MIN_BYTES


def _tiny_sft(tmp_path: Path) -> object:
    from halo.train import config

    extra = [f"--runtime.paths.checkpoints={tmp_path}/ck", f"--runtime.paths.logs={tmp_path}/lg"]
    return config.load(REPO / "examples" / "sft" / "config.yaml", "sft", extra)


def test_preflight_warns_when_scratch_is_smaller_than_the_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from halo.train.launch import preflight as pf

    cfg = _tiny_sft(tmp_path)
    params = pf.n_params(cfg)  # type: ignore[arg-type]
    need = pf.checkpoint_bytes(cfg, params)  # type: ignore[arg-type]
    assert need == params * 12 * 3  # fp32 weights and AdamW's moments, keep_last 2 + 1 written
    scratch = tmp_path / "scratch"
    scratch.mkdir()  # the checkpoints' nearest existing folder is tmp_path

    def volumes(free: int, same: bool = False) -> Callable[[Path], tuple[int, int]]:
        return lambda p: (1 if same or p == scratch else 2, free if p == scratch else 10**15)

    low = pf.scratch_space(cfg, need, scratch, volumes(need - 1))  # type: ignore[arg-type]
    assert low.ok and low.warn and low.name == "scratch"
    assert f"{params:,} parameters x 12 bytes x 3 checkpoints" in low.detail
    pf.failures([low])  # a warning never fails the run ...
    assert capsys.readouterr().err == f"halo: scratch: {low.detail}\n"  # ... but says so
    enough = pf.scratch_space(cfg, need, scratch, volumes(need))  # type: ignore[arg-type]
    assert enough.ok and not enough.warn
    # On the checkpoints' own volume the `disk` check (a failure) already answers.
    same = pf.scratch_space(cfg, need, scratch, volumes(1, same=True))  # type: ignore[arg-type]
    assert same.ok and not same.warn and "checkpoints' volume" in same.detail


def test_halo_preflight_shows_the_scratch_row(tmp_path: Path) -> None:
    cfg = REPO / "examples" / "sft" / "config.yaml"
    overrides = [f"--runtime.paths.checkpoints={tmp_path}/ck", f"--runtime.paths.logs={tmp_path}/l"]
    env = {"HALO_SCRATCH": str(tmp_path / "s")}
    proc = halo("preflight", str(cfg), "--", *overrides, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("scratch "))
    assert f"{tmp_path / 's'}: on the checkpoints' volume" in row
