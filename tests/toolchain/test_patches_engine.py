"""The patch engine on small hand-made site directories (offline).

The proofs against real upstream releases are in test_patches_upstream.py.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from halo.cli import main
from halo.errors import HaloError
from halo.patching.engine import plan_all, write_plans
from halo.patching.loader import load_patches
from halo.patching.model import State

PATCH_MODULE = '''
"""Test patch: greet() shouts."""
from halo.patching import Edit, Marker, Patch

PATCH = Patch(
    name="demo-greet",
    distribution="Demo_Pkg",
    versions=">=1.0,<3",
    summary="greet politely",
    edits=(Edit(file="demo/core.py", defect='return "hey"\\n', fix='return "hello"  # halo\\n'),),
    fixed_upstream=(Marker(file="demo/core.py", pattern=r"return \\"hello\\"$"),),
)
'''

DEFECT = 'def greet():\n    return "hey"\n'


def make_site(root: Path, *, version: str = "1.2", source: str = DEFECT) -> Path:
    site = root / "site"
    (site / "demo").mkdir(parents=True)
    (site / "demo" / "core.py").write_text(source)
    info = site / "demo_pkg-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: demo-pkg\nVersion: {version}\n")
    (info / "RECORD").write_text("demo/core.py,,\ndemo_pkg-1.2.dist-info/METADATA,,\n")
    return site


@pytest.fixture
def patch_dir(tmp_path: Path) -> Path:
    d = tmp_path / "patches"
    d.mkdir()
    (d / "demo_greet.py").write_text(PATCH_MODULE)
    return d


def states(patch_dir: Path, site: Path) -> list[State]:
    return [p.result.state for p in plan_all(load_patches(patch_dir), site)]


def test_apply_then_already_applied_without_touching_the_file(
    patch_dir: Path, tmp_path: Path
) -> None:
    site = make_site(tmp_path)
    core = site / "demo" / "core.py"
    core.chmod(0o644)
    plans = plan_all(load_patches(patch_dir), site)
    assert [p.result.state for p in plans] == [State.APPLIED]
    write_plans(plans)
    assert core.read_text() == 'def greet():\n    return "hello"  # halo\n'
    assert oct(core.stat().st_mode & 0o777) == "0o644"
    before = (core.read_bytes(), core.stat().st_mtime_ns)

    plans = plan_all(load_patches(patch_dir), site)
    assert [p.result.state for p in plans] == [State.ALREADY_APPLIED]
    assert plans[0].writes == {}
    write_plans(plans)
    assert (core.read_bytes(), core.stat().st_mtime_ns) == before


def test_stale_bytecode_is_dropped(patch_dir: Path, tmp_path: Path) -> None:
    site = make_site(tmp_path)
    cache = site / "demo" / "__pycache__"
    cache.mkdir()
    (cache / "core.cpython-312.pyc").write_bytes(b"old")
    write_plans(plan_all(load_patches(patch_dir), site))
    assert list(cache.iterdir()) == []


def test_fixed_upstream(patch_dir: Path, tmp_path: Path) -> None:
    site = make_site(tmp_path, source='def greet():\n    return "hello"\n')
    plan = plan_all(load_patches(patch_dir), site)[0]
    assert plan.result.state is State.FIXED_UPSTREAM
    assert plan.writes == {}


def test_not_installed_and_out_of_range(patch_dir: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert states(patch_dir, empty) == [State.NOT_INSTALLED]
    old = make_site(tmp_path / "old", version="3.0")
    plan = plan_all(load_patches(patch_dir), old)[0]
    assert plan.result.state is State.NOT_INSTALLED
    assert "outside the patched range >=1.0,<3" in plan.result.detail


def test_drift_names_patch_file_and_snippet(patch_dir: Path, tmp_path: Path) -> None:
    site = make_site(tmp_path, source='def greet():\n    return "yo"\n')
    result = plan_all(load_patches(patch_dir), site)[0].result
    assert result.state is State.DRIFT
    assert "patch demo-greet: demo/core.py: looked for 'return \"hey\"'" in result.detail
    assert "\n" not in result.detail


def test_ambiguous_defect_is_drift(patch_dir: Path, tmp_path: Path) -> None:
    site = make_site(tmp_path, source=DEFECT + DEFECT.replace("greet", "greet2"))
    result = plan_all(load_patches(patch_dir), site)[0].result
    assert result.state is State.DRIFT
    assert "expected 1x, found 2x" in result.detail


def test_file_not_owned_by_distribution_is_drift(patch_dir: Path, tmp_path: Path) -> None:
    site = make_site(tmp_path)
    (site / "demo_pkg-1.2.dist-info" / "RECORD").write_text("demo/other.py,,\n")
    assert states(patch_dir, site) == [State.DRIFT]


def test_fix_that_does_not_compile_writes_nothing(tmp_path: Path) -> None:
    d = tmp_path / "patches"
    d.mkdir()
    (d / "broken.py").write_text(PATCH_MODULE.replace('return "hello"  # halo', "return (("))
    site = make_site(tmp_path)
    before = (site / "demo" / "core.py").read_bytes()
    with pytest.raises(HaloError, match=r"demo-greet: .*core\.py: edited file does not compile"):
        plan_all(load_patches(d), site)
    assert (site / "demo" / "core.py").read_bytes() == before


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("PATCH = 1\n", "PATCH: expected a halo.patching.Patch, found int"),
        ("raise RuntimeError('boom')\n", "failed to load: RuntimeError: boom"),
        (
            PATCH_MODULE.replace(">=1.0,<3", "banana"),
            "PATCH.versions: expected a version specifier",
        ),
        (PATCH_MODULE.replace('"""Test patch: greet() shouts."""', ""), "module docstring"),
    ],
)
def test_bad_patch_module_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, message: str
) -> None:
    d = tmp_path / "patches"
    d.mkdir()
    (d / "bad.py").write_text(body)
    assert main(["patches", "list", "--patches", str(d)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("halo: error: ") and str(d / "bad.py") in err and message in err
    assert len(err.splitlines()) == 1


def test_duplicate_names_rejected(patch_dir: Path) -> None:
    (patch_dir / "again.py").write_text(PATCH_MODULE)
    with pytest.raises(HaloError, match="'demo-greet' is also used by"):
        load_patches(patch_dir)


def test_cli_apply_json_and_idempotent(
    patch_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = make_site(tmp_path)
    argv = [
        "patches",
        "apply",
        "--strict",
        "--json",
        "--site",
        str(site),
        "--patches",
        str(patch_dir),
    ]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mode"] == "apply"
    assert doc["patches"] == [
        {
            "name": "demo-greet",
            "distribution": "Demo_Pkg",
            "version": "1.2",
            "state": "applied",
            "files": ["demo/core.py"],
            "detail": "defect found; fixed 1 of 1 edit(s)",
        }
    ]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["patches"][0]["state"] == "already-applied"


def test_cli_strict_drift_exits_1_and_writes_nothing(
    patch_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A second, applicable patch must not be written while another one drifts.
    (patch_dir / "other.py").write_text(
        textwrap.dedent(
            '''
            """Other patch."""
            from halo.patching import Edit, Patch
            PATCH = Patch(name="demo-other", distribution="demo-pkg", versions=">=1", summary="s",
                          edits=(Edit(file="demo/core.py", defect="def greet():\\n",
                             fix="def greet():  # other\\n"),), fixed_upstream=())
            '''
        )
    )
    site = make_site(tmp_path, source='def greet():\n    return "yo"\n')
    before = (site / "demo" / "core.py").read_bytes()
    rc = main(["patches", "apply", "--strict", "--site", str(site), "--patches", str(patch_dir)])
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        line for line in err if line.startswith("halo: drift: patch demo-greet: demo/core.py")
    ]
    assert len(err) == 1
    assert (site / "demo" / "core.py").read_bytes() == before
    # Not strict: drift is reported, the applicable patch is written.
    assert main(["patches", "apply", "--site", str(site), "--patches", str(patch_dir)]) == 0
    assert (site / "demo" / "core.py").read_bytes() != before


def test_cli_verify_changes_nothing(
    patch_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = make_site(tmp_path)
    core = site / "demo" / "core.py"
    before = (core.read_bytes(), core.stat().st_mtime_ns)
    assert main(["patches", "verify", "--site", str(site), "--patches", str(patch_dir)]) == 0
    assert "demo-greet" in capsys.readouterr().out
    assert (core.read_bytes(), core.stat().st_mtime_ns) == before


def test_cli_bad_site_and_patches_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["patches", "verify", "--site", str(tmp_path / "nope"), "--patches", str(tmp_path)])
        == 2
    )
    assert "--site: expected an existing site-packages directory" in capsys.readouterr().err
    assert main(["patches", "list", "--patches", str(tmp_path / "nope")]) == 2
    assert "patches directory does not exist" in capsys.readouterr().err


def test_patches_dir_from_environment(
    patch_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("HALO_PATCHES", str(patch_dir))
    assert main(["patches", "list", "--json"]) == 0
    assert [p["name"] for p in json.loads(capsys.readouterr().out)["patches"]] == ["demo-greet"]


def test_repository_patches_load_and_are_documented() -> None:
    repo = Path(__file__).resolve().parents[2]
    patches = load_patches(repo / "patches")
    assert len(patches) >= 3
    for patch in patches:
        assert patch.fixed_upstream, patch.name
        for edit in patch.edits:
            # The fix must not look like the upstream fix, or apply would call itself upstream.
            assert not any(
                m.regex().search(edit.fix.encode())
                for m in patch.fixed_upstream
                if m.file == edit.file
            )
