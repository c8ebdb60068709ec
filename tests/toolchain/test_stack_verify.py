"""`halo stack verify` on tiny real stacks: each defect fails, naming its offender.

Every stack is installed by the real install step (a fresh venv, the real pip, offline,
hash-checked), and the real checks read it: ELF objects compiled here with gcc, pip check,
the probe in the venv's interpreter. Only the stack is small.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from stackfixtures import TinyStack, fake_torch, shared_object
from support import REPO

from halo.stack.spec import StackSpec
from halo.stack.verify import FAIL, Inputs, Row, verify

# One worker runs this module: the sound and broken stacks (venvs installed) are made once.
pytestmark = pytest.mark.xdist_group("stack-verify")

C_USE = "extern int cuda_thing(void);\nint use(void) { return cuda_thing(); }\n"
C_DEF = "int cuda_thing(void) { return 1; }\n"


def run(tmp_path: Path, stack: TinyStack, spec: StackSpec) -> dict[str, Row]:
    inputs = Inputs(
        spec=spec,
        lock=stack.lock(spec.set),
        store=stack.store,
        python=sys.executable,
        python_version=".".join(map(str, sys.version_info[:3])),
        venv=tmp_path / "venvs" / spec.set,
        patches=REPO / "patches",
        images=REPO / "images",
        repo=REPO,
    )
    rows = verify(inputs, fresh=False, cpu_tier_scratch=None, progress=lambda r: None)
    return {r.check: r for r in rows}


def good_stack(tmp_path: Path) -> TinyStack:
    """A library that finds its sibling through $ORIGIN and libm from the system."""
    stack = TinyStack(tmp_path)
    build = tmp_path / "build"
    helper = shared_object(build / "libhelper.so", C_DEF, soname="libhelper.so")
    good = shared_object(
        build / "libgood.so",
        C_USE,
        f"-L{build}",
        "-lhelper",
        "-lm",
        "-Wl,-rpath,$ORIGIN",
        "-Wl,--no-as-needed",
    )
    stack.add(
        "goodlib",
        "1.0",
        {
            "goodlib/__init__.py": b"",
            "goodlib/libhelper.so": helper.read_bytes(),
            "goodlib/libgood.so": good.read_bytes(),
        },
    )
    stack.add("torch", "2.11.0", fake_torch((2, 28, 9)))
    stack.add("nvidia-nccl-cu13", "2.28.9", {"nvidia/nccl/__init__.py": b""})
    return stack


SPEC = StackSpec("tiny", ("torch", "goodlib"))


def failures(rows: dict[str, Row]) -> dict[str, tuple[str, ...]]:
    return {name: row.failures for name, row in rows.items() if row.result == FAIL}


@pytest.fixture(scope="module")
def sound(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TinyStack, dict[str, Row]]:
    tmp = tmp_path_factory.mktemp("sound")
    stack = good_stack(tmp)
    return tmp, stack, run(tmp, stack, SPEC)


def test_a_sound_stack_passes(sound: tuple[Path, TinyStack, dict[str, Row]]) -> None:
    _, _, rows = sound
    assert failures(rows) == {}
    assert list(rows) == [
        "install", "pip-check", "versions", "patches", "imports", "torch", "nccl", "elf"
    ]  # fmt: skip
    # libgood finds libhelper through its $ORIGIN RUNPATH, not by SONAME.
    assert "0 by SONAME" in rows["elf"].detail
    assert "2.28.9 == nvidia-nccl-cu13 2.28.9" in rows["nccl"].detail
    assert "cutlass-dsl-libs-cu12-extra" not in rows["patches"].detail  # not installed here


def test_a_reused_venv_is_not_reinstalled(sound: tuple[Path, TinyStack, dict[str, Row]]) -> None:
    tmp, stack, first = sound
    marker = tmp / "venvs" / "tiny" / "marker"
    marker.write_text("kept")
    second = run(tmp, stack, SPEC)
    assert first["install"].detail.startswith("5 packages")
    assert second["install"].detail.startswith("reused") and marker.exists()
    assert failures(second) == {}


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, ...]]:
    """One stack with every defect the acceptance names; each test reads its own line."""
    tmp = tmp_path_factory.mktemp("broken")
    stack = good_stack(tmp)
    # A library linked against a CUDA 12 runtime (a fake libcudart.so.12, not shipped).
    fake = shared_object(tmp / "fake" / "libcudart.so.12", C_DEF, soname="libcudart.so.12")
    old = shared_object(
        tmp / "build" / "libold.so", C_USE, f"-L{fake.parent}", "-l:libcudart.so.12"
    )
    stack.add("oldcuda", "0.1", {"oldcuda/libold.so": old.read_bytes()})
    # A library whose DT_NEEDED exists nowhere.
    gone = shared_object(tmp / "gone" / "libhalo_gone.so.1", C_DEF, soname="libhalo_gone.so.1")
    orphan = shared_object(
        tmp / "build" / "liborphan.so", C_USE, f"-L{gone.parent}", "-l:libhalo_gone.so.1"
    )
    stack.add("orphan", "0.1", {"orphan/liborphan.so": orphan.read_bytes()})
    # A requirement nothing provides: pip check fails.
    stack.add("needy", "0.1", {"needy/__init__.py": b""}, requires=("halo-absent-dist>=1",))
    # torch built for CUDA 12.8 whose NCCL is not the lock's.
    stack.wheels = [w for w in stack.wheels if w[0] != "torch"]
    stack.add("torch", "2.11.0", fake_torch((2, 27, 3), cuda="12.8"))
    spec = StackSpec("tiny", ("torch", "goodlib", "halo_no_such_module"), absent=("needy",))
    return failures(run(tmp, stack, spec))


def test_the_broken_stack_fails_on_exactly_its_defects(broken: dict[str, tuple[str, ...]]) -> None:
    assert sorted(broken) == ["absent", "elf", "imports", "install", "nccl", "pip-check", "torch"]


def test_a_cuda12_linked_object_fails_named(broken: dict[str, tuple[str, ...]]) -> None:
    cuda12 = [line for line in broken["elf"] if "CUDA 12" in line]
    assert cuda12 == [
        "lib/python3.11/site-packages/oldcuda/libold.so (oldcuda): needs libcudart.so.12, a CUDA 12 library".replace(
            "3.11", f"{sys.version_info.major}.{sys.version_info.minor}"
        )
    ]


def test_an_unresolvable_needed_fails_named(broken: dict[str, tuple[str, ...]]) -> None:
    unresolved = [line for line in broken["elf"] if "found nowhere" in line]
    assert len(unresolved) == 1
    assert "orphan/liborphan.so (orphan): needs libhalo_gone.so.1, found nowhere" in unresolved[0]


def test_a_pip_check_failure_fails_named(broken: dict[str, tuple[str, ...]]) -> None:
    assert broken["pip-check"] == ("needy 0.1 requires halo-absent-dist, which is not installed.",)
    # The install step's own pip check stopped the install, as it stops an image build.
    assert broken["install"][-1] == "install-step: error: python exited 1"


def test_a_wrong_nccl_fails_named(broken: dict[str, tuple[str, ...]]) -> None:
    assert broken["nccl"] == ("torch reports NCCL 2.27.3, the lock has nvidia-nccl-cu13 2.28.9",)


def test_a_cuda12_torch_fails(broken: dict[str, tuple[str, ...]]) -> None:
    assert broken["torch"] == ("torch.version.cuda is 12.8, expected 13.x",)


def test_a_missing_module_and_a_present_forbidden_one_fail(
    broken: dict[str, tuple[str, ...]],
) -> None:
    assert broken["imports"][0].startswith("import halo_no_such_module: ModuleNotFoundError")
    assert broken["absent"] == ("needy imports",)


def test_the_probe_reports_the_nccl_that_is_loaded(tmp_path: Path) -> None:
    """torch reports the NCCL it was built against; the probe asks the loaded library itself."""
    import subprocess
    import sys

    from halo.stack import probe

    src = tmp_path / "nccl.c"
    src.write_text("int ncclGetVersion(int *v) { *v = 23007; return 0; }\n")
    lib = tmp_path / "libnccl.so.2"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", str(lib), str(src)],
        check=True,
    )
    code = (
        "import ctypes, os, sys, importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('probe', {probe.__file__!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "print(m._loaded_nccl())\n"
        f"ctypes.CDLL({str(lib)!r}, mode=os.RTLD_GLOBAL)\n"
        "print(m._loaded_nccl())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "2.30.7"]  # nothing loaded yet; then the loaded one
