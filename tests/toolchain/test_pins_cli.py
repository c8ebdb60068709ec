"""`halo pins ...` end to end on the committed pins and on broken copies of them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support import REPO, halo, tree_listing

from halo.errors import HaloError
from halo.pins.inputs import load_inputs
from halo.pins.lockfile import load_lock, lock_path
from halo.pins.locking import check_locks, write_locks
from halo.pins.resolve import Resolution

SETS = ("blackwell", "hopper", "vllm", "sglang", "cpu", "vllm-cpu")


def snapshot(root: Path) -> dict[str, bytes]:
    return {p: (root / p).read_bytes() for p in tree_listing(root) if (root / p).is_file()}


def test_committed_pins_pass_check() -> None:
    # Its speed budget (< 1 s) is measured by `nox -s bench`, not by a timed test.
    proc = halo("pins", "check", cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 7 sets and 6 arm64 twins; 4 OS locks and 3 arm64 ones (the bases arm64 images stand on).
    assert proc.stdout == "pins: 13 sets, 3 source pins, 7 OS locks: all invariants hold\n"


def test_pins_check_parses_each_os_lock_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The images' Pythons and the OS locks' drift read the same files: parsed once each (the
    check has a 1 s budget, and a deb lock is the largest TOML it reads after the pylocks)."""
    import argparse
    from collections import Counter

    from halo.pins import cli, deblock

    parsed: Counter[str] = Counter()
    real = deblock.load_deb_lock

    def counting(path: Path) -> deblock.DebLock:
        parsed[Path(path).name] += 1
        return real(path)

    monkeypatch.setattr(deblock, "load_deb_lock", counting)
    monkeypatch.chdir(REPO)
    assert cli._check(argparse.Namespace()) == 0, capsys.readouterr()
    assert len(parsed) == 7 and set(parsed.values()) == {1}, parsed


def test_committed_locks_name_files_never_locations() -> None:
    for name in SETS:
        text = (lock_path(REPO / "pins", name)).read_text()
        assert "://" not in text and "/opt/" not in text
        lock = load_lock(lock_path(REPO / "pins", name))
        assert lock.inputs_sha256 == load_inputs(REPO / "pins").sets[name].sha256()
        for pkg in lock.packages:
            assert len(pkg.artifacts) == 1, pkg.name
            assert pkg.artifacts[0].size, pkg.name


def test_cpu_set_tests_the_gpu_images_torch_from_the_index() -> None:
    """The CPU tier runs the torch the GPU images ship: 2.11.0, the index's CUDA 13 build."""
    torches = {name: load_lock(lock_path(REPO / "pins", name)).package("torch") for name in SETS}
    assert {name: t.version for name, t in torches.items() if t} == dict.fromkeys(SETS, "2.11.0")
    cpu = load_lock(lock_path(REPO / "pins", "cpu"))
    (art,) = cpu.package("torch").artifacts  # type: ignore[union-attr]
    assert art.file == "torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert cpu.package("nvidia-nccl-cu13") is not None  # the CUDA 13 build, not a +cpu one
    assert not load_inputs(REPO / "pins").sets["cpu"].substitutes


def test_one_transformers_and_halos_dependencies_in_every_set() -> None:
    """Checkpoints the trainer writes are read by the servers' transformers; images install
    halo with --no-deps, so every lock carries halo's own dependencies."""
    import tomllib

    from packaging.requirements import Requirement

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    halo_in = load_inputs(REPO / "pins").sets["cpu"].requirements[1]
    assert halo_in.path == "requirements/halo.in"
    assert list(halo_in.requirement_lines()) == deps
    versions = set()
    for name in SETS:
        lock = load_lock(lock_path(REPO / "pins", name))
        versions.add(lock.package("transformers").version)  # type: ignore[union-attr]
        for line in deps:
            req = Requirement(line)
            pkg = lock.package(req.name)
            assert pkg is not None and req.specifier.contains(pkg.version), (name, line)
        for need in ("tokenizers", "safetensors", "jinja2"):
            assert lock.package(need) is not None, (name, need)
    assert versions == {"5.12.1"}
    for name in ("blackwell", "hopper", "cpu"):
        assert load_lock(lock_path(REPO / "pins", name)).package("pyarrow") is not None


def test_vllm_cpu_takes_the_index_torch_through_a_recorded_override() -> None:
    lock = load_lock(lock_path(REPO / "pins", "vllm-cpu"))
    assert lock.python == "3.12" and lock.platform == "x86_64-manylinux_2_36"
    assert lock.extra["overrides"] == ["torch==2.11.0", "nvidia-nccl-cu13==2.30.7"]
    vllm = load_lock(lock_path(REPO / "pins", "vllm"))
    for name in ("torch", "torchvision", "torchaudio", "nvidia-nccl-cu13", "transformers"):
        assert lock.package(name).version == vllm.package(name).version, name  # type: ignore[union-attr]
    assert lock.package("vllm-cpu").version == vllm.package("vllm").version == "0.26.0"  # type: ignore[union-attr]
    assert lock.package("torchvision").version == "0.26.0"  # type: ignore[union-attr]


def test_blackwell_gets_the_cuda13_cute_dsl() -> None:
    lock = load_lock(lock_path(REPO / "pins", "blackwell"))
    assert lock.package("nvidia-cutlass-dsl-libs-cu13") is not None
    assert lock.package("nvidia-cutlass-dsl-libs-cu12") is None


def test_check_reports_a_violation_in_one_line(repo_copy: Path) -> None:
    lock = repo_copy / "pins" / "pylock.hopper.toml"
    lock.write_text(lock.read_text().replace("2.30.7", "2.27.7"))
    proc = halo("pins", "check", cwd=repo_copy, env={"HALO_REPO": str(repo_copy)})
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        "blackwell: nvidia-nccl-cu13: one-nccl (2.30.7 here; blackwell 2.30.7, hopper 2.27.7)",
        "hopper: nvidia-nccl-cu13: one-nccl (2.27.7 here; blackwell 2.30.7, hopper 2.27.7)",
        "hopper: nvidia-nccl-cu13: builder-matches (2.27.7 here, 2.30.7 in cuda-builder, which "
        "compiles this set's kernels; re-lock both)",
        # The arm64 twin, untouched, no longer matches its amd64 set.
        "hopper-arm64: nvidia-nccl-cu13: same-on-every-platform (2.30.7 here, 2.27.7 in hopper: "
        "torch, CUDA, NCCL and numpy are one version on every platform; re-lock hopper-arm64)",
    ]
    assert proc.stderr == "halo: 4 pin invariant violation(s)\n"


def test_check_refuses_a_lock_for_another_cpython_than_its_base_ships(repo_copy: Path) -> None:
    """sglang locked for 3.12 while its Debian 12 base ships 3.11: its cp312 wheels would not
    install; the catalog's base, its OS lock and the set's lock are read together."""
    lock = repo_copy / "pins" / "pylock.sglang.toml"
    text = lock.read_text()
    assert '\npython = "3.11"\n' in text
    lock.write_text(text.replace('\npython = "3.11"\n', '\npython = "3.12"\n'))
    proc = halo("pins", "check", cwd=repo_copy, env={"HALO_REPO": str(repo_copy)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "sglang: python: python-matches-base (locked for CPython 3.12; image sglang's base "
        "debian12-gpu ships CPython 3.11)"
    ]


def test_check_notices_a_stale_lock(repo_copy: Path) -> None:
    vllm_cpu_in = repo_copy / "pins" / "requirements" / "vllm-cpu.in"
    vllm_cpu_in.write_text(vllm_cpu_in.read_text() + "rich\n")
    proc = halo("pins", "check", cwd=repo_copy, env={"HALO_REPO": str(repo_copy)})
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        "vllm-cpu: -: lock-fresh (inputs changed; run `halo pins lock vllm-cpu`)"
    ]


def test_check_refuses_an_override_outside_its_policy(repo_copy: Path) -> None:
    lock = repo_copy / "pins" / "pylock.cpu.toml"
    text = lock.read_text()
    old = 'overrides = [\n    "nvidia-nccl-cu13==2.30.7",\n]'
    assert old in text
    lock.write_text(text.replace(old, 'overrides = ["nvidia-nccl-cu13==2.30.7", "numpy==2.3.5"]'))
    proc = halo("pins", "check", cwd=repo_copy, env={"HALO_REPO": str(repo_copy)})
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        "cpu: numpy==2.3.5: override-allowed (an override hides what packages declare; "
        "allowed only in vllm-cpu)"
    ]


BAD_INPUTS = {
    "unknown set": (("pins", "lock", "nope"), None, "unknown pin set 'nope'"),
    "unknown set in diff": (("pins", "diff", "cpu", "nope"), None, "unknown pin set 'nope'"),
    "bad platform": (
        ("pins", "lock", "cpu"),
        (
            "sets.toml",
            'platform = "x86_64-manylinux_2_36"  # Debian 12',
            'platform = "debian12"  # Debian 12',
        ),
        ".platform: Value error, expected a target like 'x86_64-manylinux_2_39'",
    ),
    "missing requirement file": (
        ("pins", "lock"),
        ("sets.toml", '"vllm-cpu.in"', '"gone.in"'),
        "'gone.in' is not a file in pins/requirements/",
    ),
    "unparsable inputs": (
        ("pins", "check"),
        ("sets.toml", "[set.cpu]", "[set.cpu"),
        "not valid TOML",
    ),
    "unparsable lock": (
        ("pins", "check"),
        ("pylock.vllm.toml", "[[packages]]", "[[packages]"),
        "pylock.vllm.toml: not valid TOML",
    ),
    "pin without a hash": (
        ("pins", "check"),
        ("pylock.cpu.toml", "\nsha256 = ", "\nsha = "),
        "packages[0].wheels[0].hashes.sha256: Field required; "
        "packages[0].wheels[0].hashes.sha: unknown key",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_touches_nothing(repo_copy: Path, case: str) -> None:
    args, edit, message = BAD_INPUTS[case]
    if edit:
        path = repo_copy / "pins" / edit[0]
        assert edit[1] in path.read_text()
        path.write_text(path.read_text().replace(edit[1], edit[2], 1))
    before = snapshot(repo_copy)
    proc = halo(*args, cwd=repo_copy, env={"HALO_REPO": str(repo_copy)})
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and message in proc.stderr
    assert proc.stderr.startswith("halo: error: ")
    assert snapshot(repo_copy) == before


def test_diff_lists_added_removed_changed() -> None:
    proc = halo("pins", "diff", "blackwell", "hopper", cwd=REPO)
    assert proc.returncode == 0
    assert any(line.split()[:2] == ["removed", "flash-attn-4"] for line in proc.stdout.splitlines())
    proc = halo("pins", "diff", "vllm", "sglang", cwd=REPO)
    assert any(line.split()[:2] == ["added", "sglang"] for line in proc.stdout.splitlines())
    assert any(line.split()[:2] == ["removed", "vllm"] for line in proc.stdout.splitlines())
    assert "changed" in proc.stdout.splitlines()[-1]


def test_why_traces_to_the_top_level_requirement() -> None:
    proc = halo("pins", "why", "nvidia-cutlass-dsl-libs-cu13", "blackwell", cwd=REPO)
    assert proc.returncode == 0
    assert proc.stdout.splitlines() == [
        "nvidia-cutlass-dsl-libs-cu13 <- nvidia-cutlass-dsl <- flash-attn-4 <- `flash-attn-4[cu13]`"
    ]
    proc = halo("pins", "why", "not-there", "cpu", cwd=REPO)
    assert proc.returncode == 2 and "no package 'not-there'" in proc.stderr


class FakeResolver:
    """Stands in for uv (the network) to test the glue: canned output, or a failure."""

    def __init__(self, fail: str | None = None, version: str = "6.0.3") -> None:
        self.fail = fail
        self.version = version

    def resolve(self, inputs, pins_dir, prefer=None):  # type: ignore[no-untyped-def]
        if inputs.name == self.fail:
            raise HaloError(f"pins/sets.toml: [set.{inputs.name}]: uv could not resolve it")
        pylock = (
            '[[packages]]\nname = "pyyaml"\nversion = "' + self.version + '"\n'
            'wheels = [{ url = "https://index.invalid/pyyaml-'
            + self.version
            + '-py3-none-any.whl",'
            ' size = 3, hashes = { sha256 = "' + "f" * 64 + '" } }]\n'
        )
        return Resolution(pylock, f"pyyaml=={self.version}\n    # via -r requirements/x.in\n")


def test_lock_writes_nothing_when_any_set_fails(repo_copy: Path) -> None:
    pins = repo_copy / "pins"
    before = snapshot(pins)
    with pytest.raises(HaloError, match=r"\[set.hopper\]"):
        write_locks(pins, ["cpu", "hopper"], FakeResolver(fail="hopper"))
    assert snapshot(pins) == before
    write_locks(pins, ["cpu"], FakeResolver())
    assert load_lock(pins / "pylock.cpu.toml").package("pyyaml") is not None
    assert (pins / "pylock.hopper.toml").read_bytes() == before["pylock.hopper.toml"]
    assert [p.name for p in pins.iterdir() if p.name.startswith(".")] == []


def test_lock_check_gives_a_unified_diff_on_drift(repo_copy: Path) -> None:
    pins = repo_copy / "pins"
    write_locks(pins, ["cpu"], FakeResolver())
    assert check_locks(pins, ["cpu"], FakeResolver()) == {}
    drift = check_locks(pins, ["cpu"], FakeResolver(version="6.0.4"))
    assert list(drift) == ["cpu"]
    assert '-version = "6.0.3"' in drift["cpu"] and '+version = "6.0.4"' in drift["cpu"]
    assert drift["cpu"].startswith("--- pins/pylock.cpu.toml (committed)")


@pytest.mark.network
@pytest.mark.skipif(shutil.which("uv") is None, reason="needs uv on PATH")
def test_relocking_cpu_for_real_is_byte_identical(repo_copy: Path) -> None:
    """From the index alone: pip's configuration (local wheel folders) is out of the way."""
    env = {"HALO_REPO": str(repo_copy), "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": ""}
    env |= {"UV_FIND_LINKS": "", "HALO_SUBSTITUTES": ""}
    proc = halo("pins", "lock", "--check", "cpu", cwd=repo_copy, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = halo("pins", "lock", "cpu", cwd=repo_copy, env=env)
    assert proc.returncode == 0, proc.stderr
    assert (
        lock_path(repo_copy / "pins", "cpu").read_bytes()
        == (lock_path(REPO / "pins", "cpu")).read_bytes()
    )
    # Changed inputs: drift is exit 1 with a diff, and the committed lock stays as it was.
    halo_in = repo_copy / "pins" / "requirements" / "halo.in"
    halo_in.write_text(halo_in.read_text() + "# a comment is an input too\n")
    proc = halo("pins", "lock", "--check", "cpu", cwd=repo_copy, env=env)
    assert proc.returncode == 1
    assert "-inputs-sha256" in proc.stdout and "+inputs-sha256" in proc.stdout
    assert (
        lock_path(repo_copy / "pins", "cpu").read_bytes()
        == (lock_path(REPO / "pins", "cpu")).read_bytes()
    )
