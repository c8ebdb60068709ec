"""nvidia-cusparselt-cu13's aarch64 wheel names a platform no installer knows.

Defect (nvidia-cusparselt-cu13 0.8.0, the index's aarch64 wheel, the arm64 locks'
``nvidia_cusparselt_cu13-0.8.0-py3-none-manylinux2014_aarch64.whl``): its WHEEL metadata says
``Tag: py3-none-manylinux2014_sbsa`` ("server base system architecture", NVIDIA's name for
its Arm servers), which is no platform tag of PEP 599/600; the file's own name says aarch64.

Symptom: once installed for linux/arm64, ``uv pip check --python-platform
aarch64-manylinux_2_36`` (as `halo image build --platform linux/arm64` runs it) and
``pip check`` on an arm64 host both refuse the stack: "nvidia-cusparselt-cu13 was built for
a different platform".

Fix: the platform the wheel's file name states, manylinux2014_aarch64, written as its
PEP 600 name ``py3-none-manylinux_2_17_aarch64`` (the same tag to every installer): so the
patched file is told apart from an upstream fix, which would write the legacy name as the
x86_64 wheel does. The install step applies it (it edits only ``*.dist-info`` metadata)
before the check.

Upstream: a wheel whose WHEEL names manylinux2014's platform, as the x86_64 wheel of the same
release already does (``Tag: py3-none-manylinux2014_x86_64``); there this patch reports
``fixed-upstream``.
"""

from halo.patching import Edit, Marker, Patch

FILE = "nvidia_cusparselt_cu13-{version}.dist-info/WHEEL"

DEFECT = "Tag: py3-none-manylinux2014_sbsa\n"
FIX = "Tag: py3-none-manylinux_2_17_aarch64\n"

PATCH = Patch(
    name="cusparselt-wheel-tag",
    distribution="nvidia-cusparselt-cu13",
    versions="==0.8.0",
    summary="state aarch64, the wheel file's platform, for the nonstandard sbsa Tag",
    edits=(Edit(file=FILE, defect=DEFECT, fix=FIX),),
    # manylinux2014's own name for the platform (x86_64's wheel; an aarch64 one fixed upstream).
    fixed_upstream=(Marker(file=FILE, pattern=r"^Tag: py3-none-manylinux2014_(x86_64|aarch64)$"),),
)
