"""The kernels layer in the stack check: a set's source derivations, installed as layer 2 does.

For every image built on the set (images.yaml ``pins``) and each of its source pins, the
derivation for this host's toolchain (halo.images.derivations): when it is realised in the
store (its record, and its wheel hashing right now), the wheel is installed into the venv
with the command of the training Dockerfile's layer 2 (``--no-index --no-deps
--require-hashes``), and its top-level modules join the import smoke; when it is not, the
row says so and how to realise it. Nothing here compiles: `halo image kernels NAME` or
`halo cache pull NAME` does that.

The JIT toolchain (DeepEP compiles its kernels at first use) is checked by ``cuda_home``:
the lock's nvcc, assembled into ``VENV/cuda`` by the install step, must report the CUDA
release torch was built for and compile a kernel for one architecture.
"""

from __future__ import annotations

import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from halo.stack.cuda_home import HOME_DIR, nvcc_release, problems
from halo.store.store import Store

JIT_ARCH = "sm_90"  # any one architecture proves the toolchain compiles device code
_KERNEL = "__global__ void halo_probe(float *x) { x[threadIdx.x] *= 2.0f; }\n"


@dataclass(frozen=True)
class Kernel:
    image: str
    name: str
    distribution: str
    drv_hash: str
    wheel: Path | None  # None: not realised in the store for this host's toolchain
    sha256: str = ""

    @property
    def modules(self) -> tuple[str, ...]:
        return wheel_modules(self.wheel) if self.wheel else ()


def wheel_modules(wheel: Path) -> tuple[str, ...]:
    """The top-level packages and modules a wheel installs (what `import` can name)."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    tops = set()
    for name in names:
        first, _, rest = name.partition("/")
        if first.endswith((".dist-info", ".data")):
            continue
        if rest == "__init__.py":
            tops.add(first)
        elif not rest and first.endswith(".py"):
            tops.add(first[:-3])
    return tuple(sorted(tops))


def set_kernels(repo: Path, set_name: str, store: Store, workdir: Path) -> list[Kernel]:
    """The source derivations of the images built on ``set_name``, realised or not."""
    from halo.builder.record import read_record
    from halo.images.catalog import load_catalog
    from halo.images.derivations import derivation_hash, image_derivations

    catalog = load_catalog(repo)
    out = []
    for image in catalog.images.values():
        if image.pins != set_name or not image.sources:
            continue
        for drv in image_derivations(repo, catalog, image):
            h = derivation_hash(drv, repo)
            record = read_record(store, h)
            wheel = None
            if record is not None:
                wheel = workdir / "kernels" / record.wheel
                if not wheel.exists():
                    store.link_into(record.sha256, wheel)
            out.append(
                Kernel(
                    image.name,
                    drv.name,
                    drv.pin.distribution,
                    h,
                    wheel,
                    record.sha256 if record else "",
                )
            )
    return out


def install_argv(venv: Path, requirements: Path) -> list[str]:
    """Layer 2 of images/training/Dockerfile, against this venv."""
    return [
        str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index", "--no-deps",
        "--require-hashes", "--no-compile", "-r", str(requirements),
    ]  # fmt: skip


def install(venv: Path, kernels: list[Kernel], env: dict[str, str]) -> list[str]:
    """Install the realised kernels; returns failure lines (empty when all went in)."""
    ready = [k for k in kernels if k.wheel is not None]
    if not ready:
        return []
    with tempfile.TemporaryDirectory(prefix="halo-kernels-") as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(
            "".join(
                f"{k.distribution} @ {k.wheel.as_uri()} --hash=sha256:{k.sha256}\n" for k in ready
            )  # type: ignore[union-attr]
        )
        proc = subprocess.run(
            install_argv(venv, req), capture_output=True, text=True, env=env, check=False
        )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        return [f"pip install of the kernels exited {proc.returncode}: {tail[0] if tail else ''}"]
    return []


def cuda_home(venv: Path, torch_cuda: str | None, env: dict[str, str]) -> tuple[list[str], str]:
    """(failures, detail) of the JIT toolchain in ``venv``: present, the right CUDA, compiles."""
    home = venv / HOME_DIR
    if not home.is_dir():
        return [f"{home}: missing; the install step assembles it when the lock brings nvcc"], "-"
    failures = problems(home)
    release = nvcc_release(home)
    if release is None:
        failures.append(f"{home}/bin/nvcc: does not run")
    elif torch_cuda and not torch_cuda.startswith(release):
        failures.append(f"nvcc {release}, but torch is the CUDA {torch_cuda} build")
    if not failures:
        with tempfile.TemporaryDirectory(prefix="halo-jit-") as tmp:
            src = Path(tmp) / "probe.cu"
            src.write_text(_KERNEL)
            proc = subprocess.run(
                [str(home / "bin" / "nvcc"), f"-arch={JIT_ARCH}", "-c", str(src), "-o",
                 str(Path(tmp) / "probe.o")],
                capture_output=True, text=True, env=env, check=False,
            )  # fmt: skip
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
                failures.append(
                    f"nvcc -arch={JIT_ARCH} failed: {tail[0] if tail else proc.returncode}"
                )
    return (
        failures,
        f"CUDA_HOME={home.name}/: nvcc {release} from the lock, compiles for {JIT_ARCH}",
    )


def kernel_detail(kernels: list[Kernel]) -> str:
    if not kernels:
        return "no source pins for this set"
    parts = []
    for k in kernels:
        state = (
            k.wheel.name
            if k.wheel
            else f"not realised ({k.drv_hash[:12]}): halo image kernels {k.image}"
        )
        parts.append(f"{k.name}: {state}")
    return "; ".join(parts)
