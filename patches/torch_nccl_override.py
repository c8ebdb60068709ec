"""torch pins an NCCL that DeepEP cannot use.

Defect (torch 2.11.0, the index's CUDA 13.0 build): its METADATA says
``Requires-Dist: nvidia-nccl-cu13==2.28.9; platform_system == "Linux"``, exactly. DeepEP
2.1.0 (a source pin) needs NCCL >= 2.30.4 for its device API and Gin backend, and refuses to
run unless torch loaded the very NCCL it linked. Every set therefore resolves with an
override (pins/overrides/nccl.txt, recorded in the lock's ``overrides``) to NCCL 2.30.7,
which DeepEP's own install guide does the same way (``pip install
"nvidia-nccl-cu13>=2.30.4" --no-deps``); NCCL 2 keeps its ABI across minor releases.

Symptom: after an offline install of the lock, ``pip check`` fails:
``torch 2.11.0 has requirement nvidia-nccl-cu13==2.28.9; ..., but you have nvidia-nccl-cu13
2.30.7``.

Fix: the installed metadata states what the lock resolved: ``nvidia-nccl-cu13==2.30.7`` on
the same platforms. The install step applies it (it edits only ``*.dist-info`` metadata)
before ``pip check``, so pip still holds every other requirement of torch.

Upstream: a torch release that no longer pins NCCL 2.28 (torch 2.12 and later); then this
patch reports ``fixed-upstream``, and `pip check` tells whether the override still fits.
"""

from halo.patching import Edit, Marker, Patch

FILE = "torch-{version}.dist-info/METADATA"

DEFECT = 'Requires-Dist: nvidia-nccl-cu13==2.28.9; platform_system == "Linux"'
FIX = 'Requires-Dist: nvidia-nccl-cu13==2.30.7; platform_system == "Linux"'

PATCH = Patch(
    name="torch-nccl-override",
    distribution="torch",
    versions="==2.11.0",
    summary="state the lock's NCCL override (2.30.7 for 2.28.9) in torch's metadata",
    edits=(Edit(file=FILE, defect=DEFECT, fix=FIX),),
    # torch no longer pins NCCL 2.28, on a line that is not this patch's own.
    fixed_upstream=(
        Marker(
            file=FILE,
            pattern=r"\A(?![\s\S]*^Requires-Dist: nvidia-nccl-cu13==2\.28\.)"
            r'(?![\s\S]*^Requires-Dist: nvidia-nccl-cu13==2\.30\.7; platform_system == "Linux"$)',
        ),
    ),
)
