"""Re-locking is stable: the committed lock is the resolver's preference, as in uv lock.

The end-to-end test resolves with the real uv against a real local index (PEP 691 + PEP 700
upload times) that gains a newer release inside the exclude-newer window between two runs.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest
from support import LocalIndex, halo

from halo.pins.lockfile import Artifact, Lock, Package, load_lock, lock_path
from halo.pins.resolve import Preferences, Upgrade, exact_pins, preferences

EXCLUDE_NEWER = "2026-06-01T00:00:00Z"
BEFORE = "2026-05-01T00:00:00.000000Z"  # inside the window
AFTER = "2026-07-01T00:00:00.000000Z"  # outside it

SETS = f"""
[set.demo]
requirements = ["demo.in"]
constraints = []
exclude = []
python = "3.11"
platform = "x86_64-manylinux_2_36"
exclude-newer = "{EXCLUDE_NEWER}"
prerelease = []
substitutes = false
"""


def wheel(name: str, version: str, requires: tuple[str, ...] = (), tag: str = "py3") -> bytes:
    """A minimal, valid wheel: METADATA, WHEEL and RECORD, nothing else."""
    info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}-none-any\n",
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
        zf.writestr(f"{info}/RECORD", "".join(f"{p},,\n" for p in files) + f"{info}/RECORD,,\n")
    return buf.getvalue()


def publish(
    index: LocalIndex, name: str, version: str, when: str, *, requires=(), tag="py3"
) -> None:  # type: ignore[no-untyped-def]
    index.add(
        name,
        f"{name}-{version}-{tag}-none-any.whl",
        wheel(name, version, requires, tag),
        upload_time=when,
    )


@pytest.fixture
def demo(repo_copy: Path, local_index: LocalIndex, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A checkout whose only set needs `app`, which needs `lib`; app 1.0 and lib 1.0 published."""
    pins = repo_copy / "pins"
    for old in pins.glob("pylock.*.toml"):
        old.unlink()
    (pins / "sets.toml").write_text(SETS)
    (pins / "requirements" / "demo.in").write_text("app\n")
    publish(local_index, "app", "1.0", BEFORE, requires=("lib>=1",))
    publish(local_index, "lib", "1.0", BEFORE)
    env = {
        "HALO_REPO": str(repo_copy),
        "HALO_INDEX_URL": local_index.url,
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
    }

    def run(*args: str) -> tuple[int, str]:
        proc = halo("pins", "lock", *args, cwd=repo_copy, env=env)
        assert proc.returncode in (0, 1), proc.stderr
        return proc.returncode, proc.stdout

    return pins, run


def lib_lock(pins: Path) -> tuple[str, str]:
    pkg = load_lock(lock_path(pins, "demo")).package("lib")
    assert pkg is not None
    return pkg.version, pkg.artifacts[0].file


def test_a_newer_release_on_the_index_moves_nothing_until_asked(demo, local_index) -> None:  # type: ignore[no-untyped-def]
    pins, run = demo
    assert run("demo") == (0, "pins/pylock.demo.toml: written\n")
    assert lib_lock(pins) == ("1.0", "lib-1.0-py3-none-any.whl")
    first = lock_path(pins, "demo").read_text()

    # The index learns lib 1.1 with an upload time inside the window (as a mirror may), a
    # better-tagged wheel of the locked lib 1.0, and lib 1.2 outside the window.
    publish(local_index, "lib", "1.1", BEFORE)
    publish(local_index, "lib", "1.0", BEFORE, tag="py311")
    publish(local_index, "lib", "1.2", AFTER)

    assert run("--check", "demo") == (0, "")
    assert run("demo") == (0, "pins/pylock.demo.toml: unchanged\n")
    assert lock_path(pins, "demo").read_text() == first

    # Asked for, the upgrade happens and --check reports it as drift first.
    code, diff = run("--check", "--upgrade-package", "lib", "demo")
    assert code == 1 and '+version = "1.1"' in diff
    assert run("--upgrade-package", "lib", "demo")[0] == 0
    assert lib_lock(pins) == ("1.1", "lib-1.1-py3-none-any.whl")

    lock_path(pins, "demo").write_text(first)
    assert run("--upgrade", "demo")[0] == 0
    assert lib_lock(pins) == ("1.1", "lib-1.1-py3-none-any.whl")

    # --upgrade of another package leaves lib where it is.
    lock_path(pins, "demo").write_text(first)
    assert run("--upgrade-package", "app", "demo") == (0, "pins/pylock.demo.toml: unchanged\n")


def test_a_changed_input_drops_the_preference_it_contradicts(demo, local_index) -> None:  # type: ignore[no-untyped-def]
    pins, run = demo
    run("demo")
    publish(local_index, "lib", "1.1", BEFORE)
    publish(local_index, "app", "1.1", BEFORE, requires=("lib>=1",))
    (pins / "requirements" / "demo.in").write_text("app\nlib>=1.1\n")
    code, diff = run("--check", "demo")
    assert code == 1 and '+version = "1.1"' in diff
    run("demo")
    assert lib_lock(pins)[0] == "1.1"
    # Only what the new input forces moves: app keeps its locked 1.0.
    app = load_lock(lock_path(pins, "demo")).package("app")
    assert app is not None and app.version == "1.0"


def _lock(*pins: tuple[str, str]) -> Lock:
    return Lock(
        set="x",
        python="3.11",
        platform="x86_64-manylinux_2_36",
        inputs_sha256="0" * 64,
        packages=tuple(
            Package(
                name=n,
                version=v,
                artifacts=(
                    Artifact(
                        f"{n}-{v}-py3-none-any.whl", hashlib.sha256(n.encode()).hexdigest(), 1
                    ),
                ),
                dependencies=(),
            )
            for n, v in pins
        ),
        extra={},
    )


def test_preferences_are_the_lock_minus_what_may_move() -> None:
    lock = _lock(("numpy", "1.26.4"), ("ml-dtypes", "0.6.0"))
    assert preferences(None) == Preferences()
    assert preferences(lock).requirements_txt() == "ml-dtypes==0.6.0\nnumpy==1.26.4\n"
    only = preferences(lock, Upgrade(packages=frozenset({"ML_Dtypes"})))
    assert only.requirements_txt() == "numpy==1.26.4\n"
    assert only.upgrade.uv_args() == ["--upgrade-package", "ML_Dtypes"]
    every = preferences(lock, Upgrade(all=True))
    assert every.pins == () and every.upgrade.uv_args() == ["--upgrade"]


def test_the_file_list_run_is_pinned_to_the_first_resolution() -> None:
    annotated = "jinja2==3.1.6\n    # via torch\ntorch==2.11.0+local\n    # via\n    #   -r x.in\n"
    assert exact_pins(annotated) == "jinja2==3.1.6\ntorch==2.11.0+local\n"


def test_an_upgrade_of_a_package_no_lock_holds_is_refused() -> None:
    locks = [_lock(("numpy", "1.26.4")), None]
    assert Upgrade(packages=frozenset({"NumPy", "nmupy"})).unknown(locks) == ["nmupy"]
    assert Upgrade(all=True, packages=frozenset({"nmupy"})).unknown(locks) == []


def test_lock_cli_refuses_bad_upgrade_and_broken_preferences(repo_copy: Path) -> None:
    """One line, exit 2, nothing written: before uv is asked anything."""
    env = {"HALO_REPO": str(repo_copy)}
    proc = halo("pins", "lock", "--upgrade-package", "nmupy", "cpu", cwd=repo_copy, env=env)
    assert proc.returncode == 2 and proc.stderr == (
        "halo: error: --upgrade-package nmupy: no package of that name in the locks of cpu\n"
    )
    lock = repo_copy / "pins" / "pylock.cpu.toml"
    lock.write_text(lock.read_text().replace("[[packages]]", "[[packages]", 1))
    broken = lock.read_bytes()
    proc = halo("pins", "lock", "cpu", cwd=repo_copy, env=env)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert "pylock.cpu.toml: not valid TOML" in proc.stderr
    assert "`halo pins lock --upgrade cpu` re-resolves without them" in proc.stderr
    assert lock.read_bytes() == broken
