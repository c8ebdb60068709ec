"""No traceback for any bad input: every input file with each fault, every `halo` subcommand.

Fault classes: not UTF-8, a folder where the file should be, unreadable, missing, malformed,
a duplicate key, a wrong type, an unknown key, empty; and for the places halo writes to, a store that is
a file, read-only or full, and a cache that is a file. The answer must be one line naming
the file, exit 2, and nothing written.

The subcommands are enumerated from halo's own parser, so one added later is covered too.
Nothing here can reach the network, a Docker engine or a registry: each run points them at
addresses where nothing answers, so a command that gets past its inputs fails fast.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from halo_forks import HaloForks
from support import COPY_IGNORE, REPO, tree_listing

from halo.cli import build_parser

NOWHERE = "http://127.0.0.1:9/simple/"
SANDBOX = {
    "DOCKER_HOST": "unix:///nonexistent/halo-test-docker.sock",
    "HALO_INDEX_URL": NOWHERE,
    "PIP_INDEX_URL": NOWHERE,
    "UV_INDEX_URL": NOWHERE,
    "UV_DEFAULT_INDEX": NOWHERE,
    "UV_OFFLINE": "1",
    "HALO_SUBSTITUTES": "",
    "PIP_FIND_LINKS": "",
    "UV_FIND_LINKS": "",
    "PIP_CONFIG_FILE": "/dev/null",
    "HALO_REGISTRY": "127.0.0.1:9/halo-test",
    "HALO_STAGING_REGISTRY": "127.0.0.1:9/halo-test-staging",
    "HF_HUB_OFFLINE": "1",
    "HF_ENDPOINT": "http://127.0.0.1:9",
    # Python's own cache, not a write of halo's: `halo patches apply` imports the checkout's
    # patch modules, whose bytecode would land in the checkout where the machine lets it.
    "PYTHONDONTWRITEBYTECODE": "1",
}
# The input files and their syntax. The locks and the trainer's configs are other modules'
# (they read them through halo.schema too); their faults are here so every command is covered.
INPUTS = {
    "images/images.yaml": "yaml",
    "ci/matrix.yaml": "yaml",
    "pins/sets.toml": "toml",
    "pins/sources.toml": "toml",
    "pins/pylock.cpu.toml": "toml",
    "examples/sft/config.yaml": "yaml",
}
WRONG_TYPE = {
    "images/images.yaml": "images: [1, 2]\n",
    "ci/matrix.yaml": "jobs: [1, 2]\n",
    "pins/sets.toml": "set = [1, 2]\n",
    "pins/sources.toml": "source = [1, 2]\n",
    "pins/pylock.cpu.toml": 'lock-version = "1.0"\ncreated-by = "halo"\npackages = [1, 2]\n',
    "examples/sft/config.yaml": "- 1\n- 2\n",
}


def _not_utf8(path: Path, rel: str, kind: str) -> None:
    data = path.read_bytes()
    cut = data.index(b"\n") + 1
    path.write_bytes(data[:cut] + b"# caf\xe9 \xff\xfe\n" + data[cut:])


def _folder(path: Path, rel: str, kind: str) -> None:
    path.unlink()
    path.mkdir()


def _unreadable(path: Path, rel: str, kind: str) -> None:
    """A file no one can open, root included (chmod 000 does not stop root): a symlink loop."""
    path.unlink()
    path.symlink_to(path.name)


def _text(make: Callable[[Path, str, str], str]) -> Callable[[Path, str, str], None]:
    def apply(path: Path, rel: str, kind: str) -> None:
        path.write_text(make(path, rel, kind))

    return apply


FILE_FAULTS: dict[str, Callable[[Path, str, str], None]] = {
    "not-utf8": _not_utf8,
    "a-folder": _folder,
    "unreadable": _unreadable,
    "missing": lambda path, rel, kind: path.unlink(),
    "malformed": _text(lambda p, r, k: "key: [unclosed\n" if k == "yaml" else "key = [unclosed\n"),
    "duplicate-key": _text(lambda p, r, k: "a: 1\na: 2\n" if k == "yaml" else "a = 1\na = 2\n"),
    "wrong-type": _text(lambda p, r, k: WRONG_TYPE[r]),
    "unknown-key": _text(
        lambda p, r, k: (
            p.read_text() + "\nzz_unknown: 1\n"
            if k == "yaml"
            else "zz_unknown = 1\n" + p.read_text()
        )
    ),
    "empty": _text(lambda p, r, k: ""),
}
# Where a command writes: (environment variable, how it is broken). "read-only" and "full"
# need a mount namespace (root, or an unprivileged one).
ENV_FAULTS = {
    "store-is-a-file": "HALO_STORE",
    "store-read-only": "HALO_STORE",
    "store-full": "HALO_STORE",
    "cache-is-a-file": "XDG_CACHE_HOME",
}


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator:  # type: ignore[type-arg]
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, sub in subs[0].choices.items():
        yield from _leaves(sub, (*path, name))


SUBCOMMANDS = {" ".join(path): parser for path, parser in _leaves(build_parser())}
# A value for each kind of argument, by metavar or name; anything else gets "x".
VALUES = {
    "SET": "cpu",
    "NAME": "cpu",
    "REF": "halo-test-faults:none",
    "PKG": "torch",
    "PATH": "pins/requirements",
    "tier": "cpu",
    "method": "sft",
    "config": "examples/sft/config.yaml",
    "inputs": "images/images.yaml",
    "keep": "1",
}


def argv_for(name: str, scratch: Path) -> list[str]:
    """``halo NAME ...`` with every required argument filled; never one that does real work."""
    parser = SUBCOMMANDS[name]
    argv = name.split()
    for action in parser._actions:
        if action.option_strings:
            flags = set(action.option_strings)
            if action.required:
                value = (
                    str(scratch / "out") if action.dest == "out" else VALUES.get(action.dest, "x")
                )
                if action.choices:  # `image export --format`: a real one, so the fault is met
                    value = next(iter(action.choices))
                argv += [action.option_strings[0], value]
            elif "--dry-run" in flags:
                argv.append("--dry-run")  # a trainer that got past its config only prints
            elif "--site" in flags:
                argv += ["--site", str(scratch / "site")]  # never the test's own environment
            continue
        if action.dest == "help" or action.nargs == argparse.REMAINDER:
            continue
        value = VALUES.get(action.metavar or "", VALUES.get(action.dest))
        if action.choices:  # one that only reads, where there is one (`serve status`)
            safe = [c for c in action.choices if c in ("status", "list", "show", "check")]
            value = (safe or list(action.choices))[0]
        if value is None and action.nargs == "?":
            continue  # optional and unknown: leave it to its default
        argv.append(value or "x")
    return argv


def _digest(root: Path) -> dict[str, tuple[int, ...]]:
    """What a write leaves on each path: its inode (a file replaced), size, mode and mtime in
    nanoseconds (a file written in place, a link shared with the template included)."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        out[path.relative_to(root).as_posix()] = (st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def forks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HaloForks]:
    server = HaloForks(tmp_path_factory.mktemp("halo-forks"))
    yield server
    server.close()


def run(  # type: ignore[no-untyped-def]
    argv: list[str],
    repo: Path,
    env: dict[str, str],
    wrap: list[str] | None = None,
    forks: HaloForks | None = None,
):
    """``halo ARGV`` in ``repo``; forked from ``forks`` where given, else a new interpreter
    (a mount namespace's wrapper needs one)."""
    full_env = {**os.environ, **SANDBOX, **env}
    try:
        if forks is not None and not wrap:
            return forks.run(argv, repo, full_env, timeout=120)
        return subprocess.run(
            [*(wrap or []), sys.executable, "-m", "halo", *argv],
            cwd=repo,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"halo {' '.join(argv)}: still running after 120 s")


def check_answer(proc, argv: list[str], exact_one_line: bool) -> None:  # type: ignore[no-untyped-def]
    shown = f"halo {' '.join(argv)} (exit {proc.returncode}):\n{proc.stdout[-1500:]}{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stdout + proc.stderr, shown
    if proc.returncode == 0:
        return
    assert proc.returncode == 2, shown
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("halo: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], shown
    if exact_one_line:
        assert len(lines) == 1, shown


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One copy of the checkout per test process; each sandbox links to its files."""
    repo = tmp_path_factory.mktemp("template") / "repo"
    shutil.copytree(REPO, repo, ignore=COPY_IGNORE)
    return repo


@pytest.fixture
def sandbox(tmp_path: Path, template: Path) -> dict[str, Path]:
    """A checkout of hard links to the template's files (a copy of each took most of a case's
    time), but for the input files that the faults break, which are copies of their own."""
    repo = tmp_path / "repo"
    shutil.copytree(template, repo, copy_function=os.link)
    for rel in INPUTS:
        (repo / rel).unlink()
        shutil.copy2(template / rel, repo / rel)
    for name in ("store", "cache", "scratch", "scratch-out"):
        (tmp_path / name).mkdir()
    (tmp_path / "scratch-out" / "site").mkdir()
    return {
        "repo": repo,
        "store": tmp_path / "store",
        "cache": tmp_path / "cache",
        "scratch": tmp_path / "scratch",
        "out": tmp_path / "scratch-out",
    }


def _env(box: dict[str, Path]) -> dict[str, str]:
    return {
        "HALO_STORE": str(box["store"]),
        "XDG_CACHE_HOME": str(box["cache"]),
        "HALO_SCRATCH": str(box["scratch"]),
        "UV_CACHE_DIR": str(box["out"] / "uv-cache"),
    }


def _nothing_written(box: dict[str, Path], before: dict[str, tuple[int, ...]]) -> None:
    assert _digest(box["repo"]) == before, "the checkout changed"
    assert tree_listing(box["store"]) == [] or not box["store"].is_dir()
    assert tree_listing(box["cache"]) == [] if box["cache"].is_dir() else True
    assert tree_listing(box["scratch"]) == []
    assert [p for p in tree_listing(box["out"]) if not p.startswith("uv-cache")] == ["site"]


@pytest.mark.parametrize("fault", sorted(FILE_FAULTS))
@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_with_every_input_file_broken(
    sandbox: dict[str, Path], forks: HaloForks, fault: str, name: str
) -> None:
    for rel, kind in INPUTS.items():
        FILE_FAULTS[fault](sandbox["repo"] / rel, rel, kind)
    before = _digest(sandbox["repo"])
    argv = argv_for(name, sandbox["out"])
    proc = run(argv, sandbox["repo"], _env(sandbox), forks=forks)
    check_answer(proc, argv, exact_one_line=True)
    _nothing_written(sandbox, before)


def _wrap(fault: str, target: Path) -> list[str]:
    """A mount namespace in which ``target`` is read-only, or a full (4 KiB) file system."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) for a read-only or full file system")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"needs a mount namespace: {probe.stderr.decode().strip()}")
    if fault == "store-read-only":
        mount = f"mount --bind {target} {target} && mount -o remount,bind,ro {target}"
    else:
        mount = f"mount -t tmpfs -o size=4k halo-test-full {target} && head -c 4096 /dev/zero > {target}/fill"
    return ["unshare", "-m", "sh", "-c", f'{mount} && exec "$0" "$@"']


@pytest.mark.parametrize("fault", sorted(ENV_FAULTS))
@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_where_it_writes_is_broken(
    sandbox: dict[str, Path], forks: HaloForks, fault: str, name: str
) -> None:
    env = _env(sandbox)
    target = Path(env[ENV_FAULTS[fault]])
    wrap = None
    if fault.endswith("is-a-file"):
        target.rmdir()
        target.write_text("a file where a folder should be\n")
    else:
        wrap = _wrap(fault, target)
    before = _digest(sandbox["repo"])
    argv = argv_for(name, sandbox["out"])
    proc = run(argv, sandbox["repo"], env, wrap, forks)
    check_answer(proc, argv, exact_one_line=False)
    assert _digest(sandbox["repo"]) == before, "the checkout changed"


# --- each input file of ours, each fault: the line names the file -----------------------------

READERS = {
    "images/images.yaml": ["image", "plan", "cpu"],
    "pins/sets.toml": ["fetch", "cpu"],
    "pins/sources.toml": ["image", "plan", "blackwell"],  # the image with source builds
    "ci/matrix.yaml": ["workflow", "render", "--check"],
}


@pytest.mark.parametrize("fault", sorted(FILE_FAULTS))
@pytest.mark.parametrize("rel", sorted(READERS))
def test_each_input_file_with_each_fault_is_one_line_naming_it(
    sandbox: dict[str, Path], rel: str, fault: str
) -> None:
    FILE_FAULTS[fault](sandbox["repo"] / rel, rel, INPUTS[rel])
    before = _digest(sandbox["repo"])
    argv = READERS[rel]
    proc = run(argv, sandbox["repo"], _env(sandbox))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    check_answer(proc, argv, exact_one_line=True)
    named = str(sandbox["repo"] / rel)
    if (rel, fault) == ("images/images.yaml", "missing"):  # it marks a checkout, too
        named = f"{sandbox['repo']}: not inside a Halo checkout (no images/images.yaml"
    assert proc.stderr.startswith(f"halo: error: {named}"), proc.stderr
    _nothing_written(sandbox, before)


STORE_WRITE = """
import hashlib, sys
from pathlib import Path
from halo.errors import HaloError
from halo.store.store import Store
data = b"some wheel"
try:
    Store(Path(sys.argv[1])).add_stream(hashlib.sha256(data).hexdigest(), [data], "w.whl")
except HaloError as exc:
    print(exc.message)
"""


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("store-is-a-file", "a file is in the way of a folder"),
        ("store-read-only", "read-only file system"),
        ("store-full", "no space left on the device"),
    ],
)
def test_a_store_that_cannot_be_written_is_one_line_naming_where(
    tmp_path: Path, fault: str, reason: str
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    wrap: list[str] = []
    if fault == "store-is-a-file":
        store.rmdir()
        store.write_text("not a folder\n")
    else:
        wrap = _wrap(fault, store)
    proc = subprocess.run(
        [*wrap, sys.executable, "-c", STORE_WRITE, str(store)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stdout.strip().splitlines()
    assert line.startswith(str(store)) and line.endswith(f"cannot write to the store: {reason}")


def test_an_output_that_cannot_be_written_is_one_line_naming_it(tmp_path: Path) -> None:
    """No module names this path itself: the CLI's net for OSErrors does."""
    import json

    inputs = tmp_path / "build-inputs.json"
    record = {"image": "cpu", "image_ref": "halo:cpu-0", "input_hash": "0" * 64}
    record |= {"inputs": {}, "base_ref": "b", "halo_version": "0"}
    inputs.write_text(json.dumps(record))
    blocker = tmp_path / "a-file"
    blocker.write_text("where the output folder should be\n")
    argv = ["image", "stamp", "--inputs", str(inputs), "--out", str(blocker / "build.json")]
    proc = subprocess.run(
        [sys.executable, "-m", "halo", *argv],
        cwd=REPO,
        env={**os.environ, **SANDBOX},
        capture_output=True,
        text=True,
        check=False,
    )
    check_answer(proc, argv, exact_one_line=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"halo: error: {blocker}: already exists (a file where a folder should be?)"
    )
    assert blocker.read_text() == "where the output folder should be\n"


def test_each_command_is_mapped_to_the_module_that_registers_it() -> None:
    """A run loads only its command's module (halo.cli.COMMANDS): the map must be exact."""
    import importlib

    from halo.cli import COMMAND_MODULES, COMMANDS

    for module in COMMAND_MODULES:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).register(sub)
        assert set(sub.choices) == {c for c, m in COMMANDS.items() if m == module}, module
    assert set(build_parser().parse_args(["image", "plan", "cpu"]).__dict__) == set(
        build_parser("image").parse_args(["image", "plan", "cpu"]).__dict__
    )
