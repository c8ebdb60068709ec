"""SGLang's memory saver preloads a CUDA 13 hook the loader cannot resolve.

Defect (sglang 0.5.17 with torch-memory-saver 0.0.9.post1 or 0.0.10, CUDA 13 wheels):
``TorchMemorySaverAdapter.configure_subprocess()`` lets torch-memory-saver put
``torch_memory_saver_hook_mode_preload_cu13.abi3.so`` in ``LD_PRELOAD`` for each
scheduler process. That library has ``NEEDED libcudart.so.13`` and no RPATH/RUNPATH,
and a pip-installed CUDA runtime lives in ``site-packages/nvidia/cu13/lib``, which is
not on the loader's search path. The child's loader resolves preloaded objects before
Python (and torch's RPATHs) exist.

Symptom: ``--enable-memory-saver`` (used by RL rollouts to release KV cache and weights
between steps) kills every scheduler at start: ``error while loading shared libraries:
libcudart.so.13: cannot open shared object file`` and "scheduler died during
initialization (exit code: 127)". Images built on a CUDA base with the runtime in
/etc/ld.so.conf do not show it; pip-only environments do.

Fix: while the scheduler is spawned, put the directories of the pip-installed CUDA
runtime (``nvidia/*/lib`` holding ``libcudart.so.*`` on ``sys.path``) in front of
``LD_LIBRARY_PATH``, then restore it.

Upstream: sgl-project/sglang issue #36533; fzyzcjy/torch_memory_saver PR #108 bakes an
``$ORIGIN``-relative RPATH into the hook libraries (sglang PR #36643 was the SGLang-side
alternative). When the installed cu13 hook carries ``$ORIGIN`` in its dynamic strings
(its RPATH), this patch reports ``fixed-upstream``; if SGLang changes the adapter
instead, the edit no longer matches and the build stops on drift for a human to judge.
"""

from halo.patching import Edit, Marker, Patch

FILE = "sglang/srt/utils/torch_memory_saver_adapter.py"
HOOK = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"

HELPER_DEFECT = """logger = logging.getLogger(__name__)
"""

HELPER_FIX = """logger = logging.getLogger(__name__)


@contextmanager
def _halo_cuda_runtime_on_loader_path(inner):
    # halo patch sglang-tms-cudart-path: the LD_PRELOAD-ed hook NEEDs libcudart.so.<major>,
    # which pip installs under site-packages/nvidia/*/lib, off the loader's search path.
    import glob
    import os
    import sys

    found = []
    for entry in sys.path:
        for lib in sorted(glob.glob(os.path.join(entry or ".", "nvidia", "*", "lib", "libcudart.so.*"))):
            if os.path.dirname(lib) not in found:
                found.append(os.path.dirname(lib))
    previous = os.environ.get("LD_LIBRARY_PATH")
    if found:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(found + ([previous] if previous else []))
    try:
        with inner:
            yield
    finally:
        if previous is None:
            os.environ.pop("LD_LIBRARY_PATH", None)
        else:
            os.environ["LD_LIBRARY_PATH"] = previous
"""

CALL_DEFECT = """        return torch_memory_saver.configure_subprocess()
"""

CALL_FIX = """        return _halo_cuda_runtime_on_loader_path(torch_memory_saver.configure_subprocess())
"""

PATCH = Patch(
    name="sglang-tms-cudart-path",
    distribution="sglang",
    versions=">=0.5.17",
    summary="let the memory saver's LD_PRELOAD hook find the pip-installed libcudart",
    edits=(
        Edit(file=FILE, defect=HELPER_DEFECT, fix=HELPER_FIX),
        Edit(file=FILE, defect=CALL_DEFECT, fix=CALL_FIX),
    ),
    fixed_upstream=(Marker(file=HOOK, pattern=r"\$ORIGIN"),),
)
