"""torch-memory-saver treats ``LD_PRELOAD`` as a single path.

Defect (torch-memory-saver 0.0.9.post1, the release SGLang 0.5.17 resolved to):
``hooks/mode_preload.py`` has ``configure_subprocess()`` *replace* ``LD_PRELOAD`` with its
hook library, dropping whatever was preloaded (jemalloc/tcmalloc, GNU stdbuf's
``libstdbuf.so``), and ``HookUtilModePreload.get_path_binary()`` returns the whole
``LD_PRELOAD`` value, which ``ctypes.CDLL`` then opens as one file name.

Symptom: with anything else preloaded in a scheduler process (``stdbuf -oL``, a
malloc), SGLang's ``--enable-memory-saver`` dies at start with
``OSError: /…/torch_memory_saver_hook_mode_preload_cu13.abi3.so:/…/libstdbuf.so:
cannot open shared object file``; the allocator the image preloads is silently lost.

Fix: prepend the hook to the existing ``LD_PRELOAD``, and pick the one entry that
names torch_memory_saver when loading it.

Upstream: fzyzcjy/torch_memory_saver PR #64 ("Handle multiple libraries in
LD_PRELOAD"), released in torch-memory-saver 0.0.10, whose ``get_path_binary`` splits
``LD_PRELOAD``; this patch then reports ``fixed-upstream``.
"""

from halo.patching import Edit, Marker, Patch

FILE = "torch_memory_saver/hooks/mode_preload.py"

PICK_DEFECT = """        assert "torch_memory_saver" in env_ld_preload, ("""

PICK_FIX = """        # halo patch tms-ld-preload-list: LD_PRELOAD is a list (colons or spaces); load our entry.
        env_ld_preload = next(
            (p for p in env_ld_preload.replace(" ", ":").split(":") if "torch_memory_saver" in p),
            env_ld_preload,
        )
        assert "torch_memory_saver" in env_ld_preload, ("""

KEEP_DEFECT = """    with change_env("LD_PRELOAD", str(get_binary_path_from_package("torch_memory_saver_hook_mode_preload"))):"""

KEEP_FIX = """    # halo patch tms-ld-preload-list: keep what is already preloaded; our hook goes first.
    _halo_hook = str(get_binary_path_from_package("torch_memory_saver_hook_mode_preload"))
    _halo_previous = os.environ.get("LD_PRELOAD", "")
    _halo_preload = f"{_halo_hook}:{_halo_previous}" if _halo_previous else _halo_hook
    with change_env("LD_PRELOAD", _halo_preload):"""

PATCH = Patch(
    name="tms-ld-preload-list",
    distribution="torch-memory-saver",
    versions=">=0.0.9",
    summary="keep other LD_PRELOAD libraries and load only the hook's entry",
    edits=(
        Edit(file=FILE, defect=PICK_DEFECT, fix=PICK_FIX),
        Edit(file=FILE, defect=KEEP_DEFECT, fix=KEEP_FIX),
    ),
    fixed_upstream=(Marker(file=FILE, pattern=r"env_ld_preload\.split\("),),
)
