"""The ELF reader and the linkage rules, on objects compiled here with gcc."""

from __future__ import annotations

from pathlib import Path

import pytest
from stackfixtures import shared_object

from halo.stack.elf import ElfError, parse, read
from halo.stack.linkage import cuda_major, host_optional, is_old_cuda, ld_so_conf_dirs

C_DEF = "int f(void) { return 1; }\n"
C_USE = "extern int f(void);\nint g(void) { return f(); }\n"


def test_reads_needed_soname_and_runpath(tmp_path: Path) -> None:
    dep = shared_object(tmp_path / "libdep.so.3", C_DEF, soname="libdep.so.3")
    obj = shared_object(
        tmp_path / "libobj.so",
        C_USE,
        f"-L{tmp_path}",
        "-l:libdep.so.3",
        "-Wl,-rpath,$ORIGIN/../lib:/opt/x",
        soname="libobj.so.1",
    )
    info = read(obj)
    assert "libdep.so.3" in info.needed and info.soname == "libobj.so.1"
    assert info.runpath == ("$ORIGIN/../lib", "/opt/x") and info.rpath == ()
    assert read(dep).soname == "libdep.so.3" and read(dep).machine == 62


def test_reads_old_style_rpath(tmp_path: Path) -> None:
    dep = shared_object(tmp_path / "libdep.so", C_DEF, soname="libdep.so")
    obj = shared_object(
        tmp_path / "libobj.so",
        C_USE,
        f"-L{dep.parent}",
        "-ldep",
        "-Wl,--disable-new-dtags,-rpath,$ORIGIN",
    )
    info = read(obj)
    assert info.rpath == ("$ORIGIN",) and info.runpath == ()


def test_a_debug_info_file_has_nothing_to_resolve(tmp_path: Path) -> None:
    import shutil
    import subprocess

    objcopy = shutil.which("objcopy")
    if objcopy is None:
        pytest.skip("needs objcopy (binutils, which gcc brings) to split debug info")
    obj = shared_object(tmp_path / "libx.so", C_USE, "-g", "-Wl,--no-as-needed", "-lm")
    dbg = tmp_path / "libx.dbg"
    subprocess.run([objcopy, "--only-keep-debug", str(obj), str(dbg)], check=True)
    assert read(obj).needed and read(dbg).needed == () and not read(dbg).is_dynamic


def test_refuses_what_is_not_a_readable_elf(tmp_path: Path) -> None:
    obj = shared_object(tmp_path / "libx.so", C_DEF)
    with pytest.raises(ElfError, match="not an ELF"):
        parse(b"#!/bin/sh\n" + b"\0" * 64)
    with pytest.raises(ElfError, match="past the end"):
        parse(obj.read_bytes()[:80])
    data = bytearray(obj.read_bytes())
    data[4] = 1  # ELFCLASS32
    with pytest.raises(ElfError, match="64-bit"):
        parse(bytes(data))


@pytest.mark.parametrize(
    ("needed", "major"),
    [
        ("libcudart.so.12", 12),
        ("libcudart.so.13", 13),
        ("libcublasLt.so.12", 12),
        ("libnvrtc-builtins.so.12.8", 12),
        ("libnvJitLink.so.13", 13),
        ("libcufft.so.11", 12),  # CUDA 12 shipped cuFFT 11
        ("libcufft.so.12", 13),  # CUDA 13 ships cuFFT 12
        ("libcusolver.so.12", 13),
        ("libcusparse.so.12", None),  # in both CUDA 12 and 13: says nothing
        ("libnccl.so.2", None),
        ("libcudnn.so.9", None),
        ("libc.so.6", None),
    ],
)
def test_cuda_major_of_a_library_name(needed: str, major: int | None) -> None:
    assert cuda_major(needed) == major
    assert is_old_cuda(needed) == (major is not None and major < 13)


def test_host_optional_is_per_package() -> None:
    assert host_optional("nvidia-nvshmem-cu13", "libmpi.so.40")
    assert host_optional("torchcodec", "libavcodec.so.61")
    assert host_optional("torch", "libmpi.so.40") is None
    assert host_optional("nvidia_nvshmem_cu13", "libucp.so.0")  # names compare normalized
    assert host_optional("torchcodec", "libcudart.so.12") is None
    assert host_optional("intel-openmp", "libsvml.so")  # offload plugins only
    assert host_optional("intel-cmplr-lib-ur", "libze_loader.so.1")
    assert host_optional("intel-openmp", "libcudart.so.13") is None


def test_ld_so_conf_follows_includes(tmp_path: Path) -> None:
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "a.conf").write_text("# comment\n/opt/a\n")
    (tmp_path / "conf.d" / "b.conf").write_text("/opt/b # trailing\n")
    (tmp_path / "ld.so.conf").write_text("include conf.d/*.conf\n/opt/top\n")
    assert ld_so_conf_dirs(tmp_path / "ld.so.conf") == ["/opt/a", "/opt/b", "/opt/top"]


def test_cuda12_objects_tolerated_only_where_named() -> None:
    from halo.stack.linkage import never_loaded

    assert never_loaded("torch_memory_saver", "torch_memory_saver_hook_mode_preload_cu12.abi3.so")
    assert never_loaded("torch-memory-saver", "torch_memory_saver_hook_mode_torch.abi3.so")
    assert never_loaded("torch-memory-saver", "libsomething_else.so") is None
    assert never_loaded("sglang", "torch_memory_saver_hook_mode_torch.abi3.so") is None
