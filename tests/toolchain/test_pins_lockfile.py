"""The locks are PEP 751 files: what other tools read, what halo refuses, how an install uses them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support import REPO, halo, tree_listing

from halo.errors import HaloError
from halo.pins.inputs import load_inputs
from halo.pins.lockfile import (
    LOCK_NAME_RE,
    Lock,
    load_lock,
    lock_path,
    parse_lock,
    render_lock,
)
from halo.store.store import Store

SETS = tuple(load_inputs(REPO / "pins").sets)
# pip's and uv's configured wheel folders out of the way: only what the test lays out exists.
NO_LOCAL_FOLDERS = {
    "PIP_CONFIG_FILE": os.devnull,
    "PIP_FIND_LINKS": "",
    "UV_FIND_LINKS": "",
    "HALO_SUBSTITUTES": "",
}


def _header(lock: Lock) -> str:
    text = lock_path(REPO / "pins", lock.set).read_text()
    return "\n".join(line[2:] for line in text.splitlines() if line.startswith("# "))


@pytest.mark.parametrize("name", SETS)
def test_committed_lock_is_pep_751_and_rewrites_to_the_same_bytes(name: str) -> None:
    from packaging.pylock import Pylock, is_valid_pylock_path

    path = lock_path(REPO / "pins", name)
    assert path.name == f"pylock.{name}.toml" and is_valid_pylock_path(path)
    text = path.read_text()
    standard = Pylock.from_dict(tomllib.loads(text))  # packaging's own PEP 751 validator
    lock = load_lock(path)
    assert [p.name for p in standard.packages] == [p.name for p in lock.packages]
    for std, ours in zip(standard.packages, lock.packages, strict=True):
        files = [*(std.wheels or []), *([std.sdist] if std.sdist else [])]
        assert [(f.filename, f.hashes["sha256"], f.size) for f in files] == [
            (a.file, a.sha256, a.size) for a in ours.artifacts
        ]
        assert [d["name"] for d in std.dependencies or []] == list(ours.dependencies)
    assert render_lock(lock, _header(lock)) == text
    assert "://" not in text and "/opt/" not in text and "/work/" not in text


def test_pip_would_pick_exactly_the_locked_files_for_the_target() -> None:
    """packaging's installer-side selection (what pip runs) on this interpreter, the cpu target."""
    from packaging.pylock import Pylock

    lock = load_lock(lock_path(REPO / "pins", "cpu"))
    if sys.version_info[:2] != tuple(int(x) for x in lock.python.split(".")):
        pytest.skip(f"needs CPython {lock.python}, the cpu set's target")
    standard = Pylock.from_dict(tomllib.loads(lock_path(REPO / "pins", "cpu").read_text()))
    chosen = {pkg.name: dist.filename for pkg, dist in standard.select()}
    assert chosen == {p.name: p.artifacts[0].file for p in lock.packages}


def _first(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


# The faults are edits of the committed cpu lock, at its first package (and its second's file).
CPU = load_lock(lock_path(REPO / "pins", "cpu"))
FIRST, SECOND = CPU.packages[0], CPU.packages[1]
FIRST_FILE, SECOND_FILE = FIRST.artifacts[0], SECOND.artifacts[0]
FAULTS = {
    "sha256 not 64 hex": (
        lambda t: _first(t, FIRST_FILE.sha256, "../../../../etc/passwd"),
        "packages[0].wheels[0].hashes.sha256: String should match pattern '^[0-9a-f]{64}$'",
    ),
    "set is not the file's": (
        lambda t: _first(t, 'set = "cpu"', 'set = "hopper"'),
        "tool.halo.set: must be 'cpu' (the file's name), got 'hopper'",
    ),
    "name of the wrong type": (
        lambda t: _first(t, f'name = "{FIRST.name}"', "name = [1, 2]"),
        "packages[0].name: Input should be a valid string, got list",
    ),
    "invalid version": (
        lambda t: _first(t, f'version = "{FIRST.version}"', 'version = "seven"'),
        "packages[0].version: Value error, not a valid version (PEP 440), got 'seven'",
    ),
    "not UTF-8": (
        lambda t: t.replace("# Generated", "# Gen\udcffrated", 1),
        "not UTF-8 text (byte 0xff at offset 5, line 1)",
    ),
    "a path out of the lock's folder": (
        lambda t: _first(t, f'path = "{FIRST_FILE.path}"', f'path = "../../{FIRST_FILE.file}"'),
        "packages[0].wheels[0].path: Value error, must be 'wheels/' and a file name",
    ),
    "another package's file": (
        lambda t: _first(t, f'path = "{FIRST_FILE.path}"', f'path = "{SECOND_FILE.path}"'),
        f"packages[0] ({FIRST.name}): '{SECOND_FILE.file}' is not a file "
        f"of {FIRST.name} {FIRST.version}",
    ),
    "a newer lock version": (
        lambda t: _first(t, 'lock-version = "1.0"', 'lock-version = "2.0"'),
        "lock-version: Input should be '1.0'",
    ),
    "an unknown key": (
        lambda t: _first(t, 'set = "cpu"', 'set = "cpu"\nmirror = "somewhere"'),
        "tool.halo.mirror: unknown key",
    ),
}


# Every reader meets every fault: the check, the fetch (which must write nothing to the
# store) and, for one fault, the plan.
CASES = [(f, c) for f in sorted(FAULTS) for c in (("pins", "check"), ("fetch", "cpu"))]
CASES.append(("invalid version", ("image", "plan", "cpu")))


@pytest.mark.parametrize(
    ("fault", "command"), CASES, ids=[f"{f}: halo {' '.join(c)}" for f, c in CASES]
)
def test_a_bad_lock_is_one_line_exit_2_and_nothing_written(
    repo_copy: Path, isolated_env: dict[str, str], tmp_path: Path, fault: str, command: tuple
) -> None:
    edit, message = FAULTS[fault]
    path = lock_path(repo_copy / "pins", "cpu")
    path.write_bytes(edit(path.read_text()).encode("utf-8", "surrogateescape"))
    before = {
        p: (repo_copy / p).read_bytes()
        for p in tree_listing(repo_copy)
        if (repo_copy / p).is_file()
    }
    env = {**isolated_env, "HALO_REPO": str(repo_copy)}
    proc = halo(*command, cwd=repo_copy, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.rstrip("\n")], proc.stderr
    assert proc.stderr.startswith(f"halo: error: {path}: ") and message in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert tree_listing(tmp_path / "store") == [] and tree_listing(tmp_path / "cache") == []
    assert {
        p: (repo_copy / p).read_bytes()
        for p in tree_listing(repo_copy)
        if (repo_copy / p).is_file()
    } == before


def test_a_lock_is_named_by_pep_751s_rule(tmp_path: Path) -> None:
    assert LOCK_NAME_RE.match("pylock.vllm-cpu.toml")["set"] == "vllm-cpu"  # type: ignore[index]
    old = tmp_path / "cpu.lock"
    shutil.copy(lock_path(REPO / "pins", "cpu"), old)
    with pytest.raises(HaloError, match=r"cpu\.lock: a lock is named pylock\.SET\.toml"):
        load_lock(old)
    with pytest.raises(HaloError, match="lock not found; run `halo pins lock gone`"):
        load_lock(lock_path(tmp_path, "gone"))


def test_every_problem_is_reported_at_once() -> None:
    text = lock_path(REPO / "pins", "cpu").read_text()
    for edit, _ in (FAULTS["sha256 not 64 hex"], FAULTS["name of the wrong type"]):
        text = edit(text)
    with pytest.raises(HaloError) as err:
        parse_lock(text, "x")
    assert err.value.message.startswith("x: 2 problems: packages[0].name: ")
    assert "packages[0].wheels[0].hashes.sha256: " in err.value.message


# --- an install from the lock, offline, by the two installers that read PEP 751 --------------


def _python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _tiny_set(repo: Path) -> None:
    """A small real set: halo's own dependencies (pure and compiled wheels) for this Python."""
    sets = repo / "pins" / "sets.toml"
    sets.write_text(
        sets.read_text() + "\n[set.tiny]\n"
        'requirements = ["halo.in"]\nconstraints = []\nexclude = []\n'
        f'python = "{_python()}"\nplatform = "x86_64-manylinux_2_36"\n'
        'exclude-newer = "2026-11-25T00:00:00Z"\nprerelease = []\nsubstitutes = false\n'
    )


def _install(
    installer: str, lock: Path, venv: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    uv = shutil.which("uv")
    assert uv is not None
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(venv)], check=True, env=env)
    python = str(venv / "bin" / "python")
    if installer == "uv":
        argv = [
            uv,
            "pip",
            "install",
            "--offline",
            "--no-config",
            "--python",
            python,
            "-r",
            str(lock),
        ]
    else:
        argv = [sys.executable, "-m", "pip", "--isolated", "--python", python, "install"]
        argv += ["--no-index", "-r", str(lock)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, check=False)


@pytest.mark.network
@pytest.mark.skipif(shutil.which("uv") is None, reason="needs uv on PATH")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sets target Linux")
def test_uv_and_pip_install_a_real_lock_offline_and_refuse_a_tampered_hash(
    repo_copy: Path, isolated_env: dict[str, str], tmp_path: Path
) -> None:
    pytest.importorskip("pip", minversion="26.3", reason="pip reads PEP 751 locks from 26.3")
    _tiny_set(repo_copy)
    env = {**os.environ, **isolated_env, **NO_LOCAL_FOLDERS, "HALO_REPO": str(repo_copy)}
    for args in (("pins", "lock", "tiny"), ("fetch", "tiny")):  # real resolution, real wheels
        proc = halo(*args, cwd=repo_copy, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    lock = load_lock(lock_path(repo_copy / "pins", "tiny"))
    assert {"pydantic-core", "pyyaml", "tomli-w"} <= {p.name for p in lock.packages}

    # The layout the lock names: the lock, and wheels/FILE beside it; no index, no network.
    folder = tmp_path / "offline"
    store = Store(Path(isolated_env["HALO_STORE"]))
    for art in lock.artifacts:
        store.link_into(art.sha256, folder / art.path)
    good = folder / "pylock.tiny.toml"
    shutil.copy(lock_path(repo_copy / "pins", "tiny"), good)
    env |= {"UV_OFFLINE": "1", "UV_NO_CACHE": "1", "PIP_NO_CACHE_DIR": "1"}

    victim = lock.package("pyyaml").artifacts[0]  # type: ignore[union-attr]
    bad = folder / "pylock.tampered.toml"
    bad.write_text(good.read_text().replace(victim.sha256, "0" * 64))

    for installer in ("uv", "pip"):
        venv = tmp_path / f"venv-{installer}"
        proc = _install(installer, good, venv, env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        probe = "import yaml, pydantic, tomli_w; print(yaml.__version__, pydantic.VERSION)"
        out = subprocess.run(
            [venv / "bin" / "python", "-c", probe], capture_output=True, text=True, check=True
        )
        assert out.stdout.split() == [
            lock.package("pyyaml").version,  # type: ignore[union-attr]
            lock.package("pydantic").version,  # type: ignore[union-attr]
        ]
        proc = _install(installer, bad, venv, env)
        assert proc.returncode != 0, f"{installer} installed a file whose hash is not the lock's"
        said = (proc.stdout + proc.stderr).lower()
        assert "hash" in said and victim.sha256 in said, said[-2000:]
