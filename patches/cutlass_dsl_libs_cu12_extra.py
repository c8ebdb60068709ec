"""nvidia-cutlass-dsl requires its CUDA 12 libraries unconditionally.

Defect (nvidia-cutlass-dsl 4.6.0 and 4.8.1, the releases the vllm, sglang and blackwell locks
hold): the wheel's METADATA says ``Requires-Dist: nvidia-cutlass-dsl-libs-cu12==<version>``
with no marker, while the CUDA 13 libraries come with the ``cu13`` extra. A CUDA 13 stack
installs ``nvidia-cutlass-dsl[cu13]`` (flash-attn-4[cu13], vllm, sglang), and the locks
exclude ``nvidia-cutlass-dsl-libs-cu12`` on purpose (pins/sets.toml ``exclude``): no CUDA 12
library in a CUDA 13 image, which `halo pins check` and the stack check's ELF audit enforce.

Symptom: ``pip check`` fails in every image build and stack check that holds cutlass-dsl:
``nvidia-cutlass-dsl 4.8.1 requires nvidia-cutlass-dsl-libs-cu12, which is not installed``.
Nothing at run time needs the CUDA 12 libraries: ``cutlass.cute`` loads the libs-cu13 ones.

Fix: make the requirement what it is for a CUDA 13 stack, an extra of its own: the line
becomes ``...; extra == "cu12"`` (declared with ``Provides-Extra: cu12``), so ``pip check``
holds the installed stack to every other requirement. The install step applies it (it edits
only ``*.dist-info`` metadata) before ``pip check``, in the image build and in the stack check.

Upstream: the cu13 variant is an extra while the cu12 one is not (NVIDIA/cutlass, the DSL's
``setup.py``/``pyproject`` of the nvidia-cutlass-dsl meta-package). When a release makes the
cu12 requirement conditional (any marker on that line), or drops it, this patch reports
``fixed-upstream`` and stops; if the line changes shape otherwise, the build stops on drift.
"""

from halo.patching import Edit, Marker, Patch

FILE = "nvidia_cutlass_dsl-{version}.dist-info/METADATA"

DEFECT = """Requires-Dist: nvidia-cutlass-dsl-libs-cu12=={version}
"""

FIX = """Requires-Dist: nvidia-cutlass-dsl-libs-cu12=={version}; extra == "cu12"
Provides-Extra: cu12
"""

PATCH = Patch(
    name="cutlass-dsl-libs-cu12-extra",
    distribution="nvidia-cutlass-dsl",
    versions=">=4.0",
    summary="make the CUDA 12 libs of the CuTe DSL an extra, as the CUDA 13 ones are (pip check)",
    edits=(Edit(file=FILE, defect=DEFECT, fix=FIX),),
    fixed_upstream=(
        # The requirement carries a marker (an extra, a platform, ...): not ours, which is
        # followed by its Provides-Extra line.
        Marker(
            file=FILE,
            pattern=r"^Requires-Dist: nvidia-cutlass-dsl-libs-cu12\b[^\n;]*;[^\n]*\n(?!Provides-Extra: cu12\n)",
        ),
        # The requirement is gone.
        Marker(file=FILE, pattern=r"\A(?![\s\S]*^Requires-Dist: nvidia-cutlass-dsl-libs-cu12\b)"),
    ),
)
