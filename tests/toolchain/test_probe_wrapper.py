"""The first-object probe's nvcc wrapper (halo.builder.docker), run here with a stand-in nvcc:
with the pin's `probe` set, a compile of another source leaves an empty object and the
dependency file ninja reads, and never reaches nvcc. The chosen source's compile is the kernels
tests' (tests/toolchain/test_kernels_upstream.py, in the builder image)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from halo.builder.docker import _NVCC_ONCE, PROBE_SOURCE

CHOSEN = "csrc/flash_attn/src/flash_fwd_hdim32_bf16_sm80.cu"


def _wrapper(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    cuda = tmp_path / "cuda" / "bin"
    cuda.mkdir(parents=True)
    called = tmp_path / "nvcc-called"
    nvcc = cuda / "nvcc"
    nvcc.write_text(f'#!/bin/sh\necho "$*" >> {called}\n')
    nvcc.chmod(0o755)
    once = tmp_path / "nvcc-once"
    once.write_text(_NVCC_ONCE)
    once.chmod(0o755)
    return once, called, {**os.environ, "CUDA_HOME": str(tmp_path / "cuda")}


def _compile(once: Path, env: dict[str, str], source: str, obj: Path) -> int:
    argv = [str(once), "--generate-dependencies-with-compile", "--dependency-output",
            f"{obj}.d", "-c", f"/src/{source}", "-o", str(obj), "-gencode", "arch=compute_100,code=sm_100"]  # fmt: skip
    return subprocess.run(argv, env=env, check=False).returncode


def test_another_source_leaves_an_empty_object_and_its_dependencies(tmp_path: Path) -> None:
    once, called, env = _wrapper(tmp_path)
    env[PROBE_SOURCE] = CHOSEN
    obj = tmp_path / "build" / "flash_bwd_hdim128_bf16_causal_sm80.o"
    obj.parent.mkdir()
    assert (
        _compile(once, env, "csrc/flash_attn/src/flash_bwd_hdim128_bf16_causal_sm80.cu", obj) == 0
    )
    assert obj.read_bytes() == b""
    assert Path(f"{obj}.d").read_text() == f"{obj}:\n"
    assert not called.exists()  # nvcc never ran


def test_a_source_whose_name_ends_like_the_chosen_one_is_not_it(tmp_path: Path) -> None:
    """The match is the whole path under the tree, not a suffix of the file name."""
    once, called, env = _wrapper(tmp_path)
    env[PROBE_SOURCE] = CHOSEN
    obj = tmp_path / "x.o"
    assert _compile(once, env, "csrc/flash_attn/src/other_flash_fwd_hdim32_bf16_sm80.cu", obj) == 0
    assert obj.read_bytes() == b"" and not called.exists()


def test_calls_that_compile_nothing_pass_straight_through(tmp_path: Path) -> None:
    once, called, env = _wrapper(tmp_path)
    env[PROBE_SOURCE] = CHOSEN
    assert subprocess.run([str(once), "--version"], env=env, check=False).returncode == 0
    assert called.read_text() == "--version\n"
