"""FlashAttention-3's build downloads its own nvcc and ptxas, then runs git.

Defect (flash-attention v2.8.3.post1, ``hopper/setup.py``, FA3 3.0.0b1): whenever the CUDA
toolchain is not exactly 12.8, ``setup.py`` downloads nvcc 12.6.85 and ptxas 12.8.93 from
NVIDIA's redistributable server into ``third_party/nvidia/backend``, points PYTORCH_NVCC at
them, and ``chmod``s the downloaded nvcc unconditionally (so even
FLASH_ATTENTION_OFFLINE_BUILD, which skips the download, dies on the missing file). It also
runs ``git submodule update --init ../csrc/cutlass`` unconditionally.

Symptom: with the locked CUDA 13.0 toolchain and no network (`--network none`, `unshare
-n`), the build fails before compiling anything; with network it compiles with an unpinned
nvcc 12.6 instead of the locked one, and git fails outside a checkout (or crashes the build
where git is not installed: ``FileNotFoundError``).

Fix: download only for the CUDA 12.x toolchains the workaround was written for (12.3 up to,
not including, 13.0, and not 12.8), so the given CUDA_HOME (the cuda-builder lock's nvcc)
compiles; run the submodule update only in a git checkout (halo places the pinned cutlass
from its own archive, verified by content hash).

Upstream: flash-attention's later ``hopper/setup.py`` uses this same condition ("For CUDA
13.0+, use system nvcc instead of downloading CUDA 12.x toolchain"); then the first edit
reports ``fixed-upstream``.
"""

from halo.patching import Edit, Marker, Patch

FILE = "hopper/setup.py"

DOWNLOAD_DEFECT = """    if bare_metal_version != Version("12.8"):
        download_and_copy(
"""

DOWNLOAD_FIX = """    # halo patch fa3-no-toolchain-download: CUDA 13 compiles with the nvcc it is given (the
    # locked one in CUDA_HOME); the download is for the 12.x toolchains it was written for.
    if bare_metal_version < Version("13.0") and bare_metal_version != Version("12.8"):
        download_and_copy(
"""

GIT_DEFECT = """# files included in the source distribution, in case the user compiles from source.
subprocess.run(["git", "submodule", "update", "--init", "../csrc/cutlass"])
"""

GIT_FIX = """# files included in the source distribution, in case the user compiles from source.
# halo patch fa3-no-toolchain-download: only a git checkout has a submodule to update; a
# pinned source archive carries its cutlass already.
if os.path.isdir(os.path.join(this_dir, os.pardir, ".git")):
    subprocess.run(["git", "submodule", "update", "--init", "../csrc/cutlass"])
"""

PATCH = Patch(
    name="fa3-no-toolchain-download",
    distribution="flash_attn_3",
    versions=">=3.0.0b1,<3.1",
    summary="compile with the given CUDA 13 nvcc: no nvcc/ptxas download, no git outside a checkout",
    edits=(
        Edit(file=FILE, defect=DOWNLOAD_DEFECT, fix=DOWNLOAD_FIX),
        Edit(file=FILE, defect=GIT_DEFECT, fix=GIT_FIX),
    ),
    fixed_upstream=(
        Marker(
            file=FILE, pattern=r'and bare_metal_version < Version\("13\.0"\) and bare_metal_version'
        ),
    ),
)
