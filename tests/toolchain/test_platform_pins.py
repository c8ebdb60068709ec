"""Per-platform locks: every arm64 twin (pins/pylock.SET-arm64.toml) holds the rules on its own
and matches its amd64 set; `halo pins check` fails on drift between them.

The breakages are made to copies of the committed locks, as text (what an edit or a bad
re-lock would leave), and checked through the CLI in a copy of the checkout.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from support import REPO, halo

from halo.pins.inputs import load_inputs
from halo.pins.locking import load_all, twin_of, twin_preferences

TWINS = ("cpu", "blackwell", "hopper", "cuda-builder", "vllm", "sglang")


def test_every_arm64_twin_is_the_same_inputs_for_aarch64() -> None:
    inputs = load_inputs(REPO / "pins")
    for name in TWINS:
        base, twin = inputs.sets[name], inputs.sets[f"{name}-arm64"]
        assert twin.platform == "aarch64-manylinux_2_36" and base.arch == "x86_64"
        same = ("requirements", "constraints", "overrides", "exclude", "prerelease", "python")
        assert all(getattr(base, f) == getattr(twin, f) for f in same), name
        assert twin_of(inputs, twin.name) == name and twin_of(inputs, name) is None
    assert twin_of(inputs, "vllm-cpu") is None  # a set of its own, not cpu's twin


def test_the_committed_twins_pass_and_share_the_stack() -> None:
    proc = halo("pins", "check", cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = load_all(REPO / "pins")
    for name in TWINS:
        a, b = state.locks[name], state.locks[f"{name}-arm64"]
        assert b.platform.startswith("aarch64-")
        for pkg in ("torch", "numpy", "nvidia-nccl-cu13", "cuda-toolkit"):
            assert [p.version for p in a.entries(pkg)] == [p.version for p in b.entries(pkg)]


def test_a_twin_prefers_its_amd64_sets_versions() -> None:
    """A first lock of a twin (none committed) starts from the amd64 set's pins, then its own."""
    state = load_all(REPO / "pins")
    prefer = dict(twin_preferences(state.locks["vllm"], None).pins)
    assert prefer["vllm"] == "0.26.0" and prefer["torch"] == "2.11.0"
    both = dict(twin_preferences(None, state.locks["sglang-arm64"]).pins)
    assert "decord2" in both  # its own pins fill in what the reference lacks


def _edit(path: Path, fn: Callable[[str], str]) -> None:
    text = path.read_text()
    new = fn(text)
    assert new != text, "the edit changed nothing"
    path.write_text(new)


def _package_block(text: str, name: str) -> tuple[int, int]:
    """Where [[packages]] ``name`` starts and ends in a lock's text."""
    start = text.index(f'[[packages]]\nname = "{name}"\n')
    end = text.find("\n[[packages]]\n", start + 1)
    return start, len(text) if end < 0 else end + 1


def _other_torch(text: str) -> str:
    """torch 2.10.0 for aarch64: its version and its file, as a lock of another day says."""
    start, end = _package_block(text, "torch")
    return text[:start] + text[start:end].replace("2.11.0", "2.10.0") + text[end:]


def _drop_package(name: str) -> Callable[[str], str]:
    def drop(text: str) -> str:
        start, end = _package_block(text, name)
        return text[:start] + text[end:]

    return drop


def _other_hash(file: str) -> Callable[[str], str]:
    def swap(text: str) -> str:
        at = text.index(f'path = "wheels/{file}"')
        m = re.compile(r'sha256 = "([0-9a-f]{64})"').search(text, at)
        assert m is not None
        return text[: m.start(1)] + "0" * 64 + text[m.end(1) :]

    return swap


def _wheel_of(lock: Path, name: str) -> str:
    doc = tomllib.loads(lock.read_text())
    (pkg,) = [p for p in doc["packages"] if p["name"] == name]
    return pkg["wheels"][0]["path"].removeprefix("wheels/")


BREAKAGES = {
    # The same torch on every platform: the trainer's checkpoints and kernels assume one.
    "arm64 torch 2.10.0": (
        "cpu-arm64",
        lambda lock: _other_torch,
        "cpu-arm64: torch: same-on-every-platform (2.10.0 here, 2.11.0 in cpu",
    ),
    "arm64 lock missing an amd64 package": (
        "blackwell-arm64",
        lambda lock: _drop_package("einops"),
        "blackwell-arm64: einops: platform-entry (in blackwell (",
    ),
    "arm64 wheel with another hash": (
        "vllm-arm64",
        lambda lock: _other_hash(_wheel_of(lock, "fastapi")),
        "vllm-arm64: fastapi: platform-wheel-hash (",
    ),
}


@pytest.mark.parametrize("case", sorted(BREAKAGES))
def test_pins_check_fails_on_drift_between_platforms(case: str, repo_copy: Path) -> None:
    set_name, breakage, expected = BREAKAGES[case]
    lock = repo_copy / "pins" / f"pylock.{set_name}.toml"
    _edit(lock, breakage(lock))
    proc = halo("pins", "check", cwd=repo_copy)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith(expected) for line in lines), lines
    assert "pin invariant violation(s)" in proc.stderr


def test_a_wheel_for_another_machine_in_a_twin_is_refused(repo_copy: Path) -> None:
    """An x86_64 wheel in an arm64 lock (a twin copied from its amd64 set) would not install."""
    arm = repo_copy / "pins" / "pylock.cpu-arm64.toml"
    amd = (repo_copy / "pins" / "pylock.cpu.toml").read_text()
    start, end = _package_block(amd, "torch")
    text = arm.read_text()
    a_start, a_end = _package_block(text, "torch")
    arm.write_text(text[:a_start] + amd[start:end] + text[a_end:])
    proc = halo("pins", "check", cwd=repo_copy)
    assert proc.returncode == 1
    assert any(
        line.startswith("cpu-arm64: torch: platform-wheel (torch-2.11.0-") and "x86_64" in line
        for line in proc.stdout.splitlines()
    ), proc.stdout
