"""DeepEP links against a CUDA toolkit installed in /usr/local/cuda.

Defect (DeepEP 2.1.0, commit dd758ca, ``setup.py``):

- the CCCL include folder is hard-coded as ``/usr/local/cuda/include/cccl``, whatever
  CUDA_HOME says;
- the extension links ``-lcuda``, which needs the driver's ``libcuda.so`` (or a toolkit's
  stub) at build time and makes ``import deep_ep`` need the driver, although DeepEP
  already opens the driver itself at first use (``csrc/utils/lazy_driver.hpp``:
  ``dlopen("libcuda.so.1")``); the index's CUDA wheels carry no stub;
- the NVSHMEM and NCCL run paths are the absolute folders of the build host's
  site-packages (``-Wl,-rpath,{nvshmem_root_dir}/lib``): a path of the builder, not of the
  venv the wheel is installed in; and NCCL is linked as ``-l:libnccl.so.2`` with no ``-L``
  for its folder, which the linker does not search by run path.

Symptom: with the cuda-builder lock's toolchain (CUDA_HOME assembled from the index's
wheels) the link fails on ``-lcuda`` and on ``cannot find -l:libnccl.so.2``; a wheel built
elsewhere finds NVSHMEM only where its builder had it, and carries that builder's path.

Fix: CCCL from $CUDA_HOME; no ``-lcuda`` (the driver stays lazily loaded); NCCL's folder
among the library folders; run paths relative to the extension (``$ORIGIN/../nvidia/{nvshmem,nccl}/lib``: the wheels' own layout
in the same site-packages). The link goes through setuptools' spawn, not a shell, so
``$ORIGIN`` reaches the linker as written.

Upstream: none yet. If upstream drops ``-lcuda`` the first marker reports fixed-upstream.
"""

from halo.patching import Edit, Marker, Patch

FILE = "setup.py"

CCCL_DEFECT = """                    '/usr/local/cuda/include/cccl']"""
CCCL_FIX = """                    # halo patch deepep-wheel-toolchain: CCCL of the CUDA_HOME in use.
                    os.path.join(os.environ.get('CUDA_HOME', '/usr/local/cuda'), 'include', 'cccl')]"""

LCUDA_DEFECT = """    extra_link_args = ['-lcuda']
"""
LCUDA_FIX = """    # halo patch deepep-wheel-toolchain: the driver is opened lazily (lazy_driver.hpp); no -lcuda.
    extra_link_args = []
"""

NVSHMEM_DEFECT = """f'-Wl,-rpath,{nvshmem_root_dir}/lib'"""
# Relative to the installed extension: site-packages/deep_ep/_C*.so -> site-packages/nvidia/.
NVSHMEM_FIX = """'-Wl,-rpath,$ORIGIN/../nvidia/nvshmem/lib'"""

NCCL_DEFECT = """    extra_link_args.extend([f'-l:{nccl_lib}', f'-Wl,-rpath,{nccl_root_dir}/lib'])
"""
NCCL_FIX = """    # halo patch deepep-wheel-toolchain: the linker finds NCCL by -L, not by the run path.
    library_dirs.extend([f'{nccl_root_dir}/lib'])
    extra_link_args.extend([f'-l:{nccl_lib}', '-Wl,-rpath,$ORIGIN/../nvidia/nccl/lib'])
"""

PATCH = Patch(
    name="deepep-wheel-toolchain",
    distribution="deep_ep",
    versions=">=2.1.0,<2.2",
    summary="build against the index's CUDA wheels: CCCL from CUDA_HOME, no -lcuda, relative run paths",
    edits=(
        Edit(file=FILE, defect=CCCL_DEFECT, fix=CCCL_FIX),
        Edit(file=FILE, defect=LCUDA_DEFECT, fix=LCUDA_FIX),
        Edit(file=FILE, defect=NVSHMEM_DEFECT, fix=NVSHMEM_FIX),
        Edit(file=FILE, defect=NCCL_DEFECT, fix=NCCL_FIX),
    ),
    fixed_upstream=(Marker(file=FILE, pattern=r"^    extra_link_args = \[\]$"),),
)
