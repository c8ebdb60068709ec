"""Assemble an image for another platform on this host: layers made here, nothing emulated.

As Bazel's rules_oci does, an arm64 image is put together from layers instead of running its
Dockerfile: no RUN step executes an arm64 program. On top of the arm64 base (made by
mmdebstrap; qemu ran only its maintainer scripts):

0. the working folders the Dockerfile makes (/workspace, /srv);
1. the locked stack: a venv whose packages uv installs for the target (``--python-platform
   aarch64-manylinux_2_36``), offline from the store with every hash checked, the metadata
   patches applied and ``uv pip check`` run for that platform, then made the image's venv
   (its interpreter is the base's /usr/bin/python3; scripts start with /opt/venv/bin/python);
2. the source derivations' wheels, when the image has any;
3. halo's wheel, the patches applied strictly, /etc/halo/build.json and the SBOM, checked
   against what got installed (halo.images.stamp, with the staged site-packages).

The image config mirrors the Dockerfile's (ENV, WORKDIR, SHELL, CMD) and carries the same
labels. Every layer is a tar written here in a fixed order with fixed owners, modes and
times (SOURCE_DATE_EPOCH), so the same inputs give the same image ID.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from halo.errors import HaloError
from halo.images.graph import (
    UV_VERSION,
    FetchDebs,
    ImageNode,
    MakeBase,
    Plan,
    source_date_epoch,
)
from halo.images.realise.build import Command, build_inputs, exclusive_context
from halo.paths import cache_home, per_engine
from halo.report import say

if TYPE_CHECKING:
    from halo.images.docker import Docker
    from halo.pins.lockfile import Lock
    from halo.store.store import Store

VENV = "opt/venv"  # where the Dockerfiles make the image's venv (ENV VIRTUAL_ENV)
SHEBANG = b"#!/opt/venv/bin/python"
# What `uv venv` writes that `python -m venv` in the image does not, or that names this host.
UV_VENV_EXTRAS = (
    ".gitignore",
    ".lock",
    "CACHEDIR.TAG",
    "bin/activate",
    "bin/activate.bat",
    "bin/activate.csh",
    "bin/activate.fish",
    "bin/activate.nu",
    "bin/activate.ps1",
    "bin/activate.xsh",
    "bin/activate_this.py",
    "bin/deactivate.bat",
    "bin/pydoc.bat",
)
WORK_DIRS = ("srv", "workspace")


@dataclass(frozen=True)
class AssemblyRecipe:
    """How this host assembles an image node: its work folder and the install it runs."""

    work: Path
    python_platform: str  # uv's target, the lock's platform (aarch64-manylinux_2_36)
    install: Command  # the locked stack's install, exactly


def work_dir(node: ImageNode) -> Path:
    return per_engine(cache_home() / "assemble") / f"{node.image.name}{node.platform.suffix}"


def uv_env() -> dict[str, str]:
    """uv with no configuration of this host: no config files, no managed Python downloads,
    no index, no cache shared with anything else."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_", "PYTHON"))}
    return {
        **kept,
        "UV_NO_CONFIG": "1",
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_NO_PROGRESS": "1",
        # This host's python runs in the staged venv (the metadata patches, a check): what it
        # would compile carries the time it ran.
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def install_argv(venv: Path, wheels: Path, python_platform: str, python: str) -> list[str]:
    return [
        "uv", "pip", "install", "--python", str(venv / "bin" / "python"),
        "--python-platform", python_platform, "--python-version", python,
        "--no-index", "--find-links", str(wheels), "--no-deps", "--require-hashes",
        "--no-compile", "--link-mode", "copy", "--no-cache", "--reinstall",
        "-r", str(wheels / "requirements.txt"),
    ]  # fmt: skip


def assembly_recipe(
    repo: Path, node: ImageNode, python_platform: str, python: str
) -> AssemblyRecipe:
    work = work_dir(node)
    argv = install_argv(work / "root" / VENV, work / "wheels", python_platform, python)
    return AssemblyRecipe(work, python_platform, Command(tuple(argv), str(work), {}))


def _run(argv: Sequence[str], what: str, cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run(
            list(argv), cwd=cwd, env=uv_env(), capture_output=True, text=True, check=False
        )
    except FileNotFoundError:
        raise HaloError(f"{argv[0]}: not found ({what}); install uv=={UV_VERSION}") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise HaloError(f"{what}: failed (exit {proc.returncode}): {' | '.join(tail)}")
    return proc.stdout


def check_uv() -> None:
    """The installer the plan names (an input of the image), or one error line."""
    out = _run(["uv", "--version"], "uv --version").split()
    if out[1:2] != [UV_VERSION]:
        raise HaloError(
            f"uv {' '.join(out[1:2]) or '?'} here; the image is assembled with uv {UV_VERSION} "
            f"(an input of its hash): pip install uv=={UV_VERSION}"
        )


# --- deterministic layers --------------------------------------------------------------


@dataclass(frozen=True)
class Layer:
    diff_id: str  # sha256 of the uncompressed tar
    path: Path
    what: str  # the history line


class _Hashing(io.RawIOBase):
    """A write-only file that hashes what goes through it on its way to ``sink``."""

    def __init__(self, sink: io.BufferedWriter) -> None:
        self.sink, self.digest = sink, hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.digest.update(data)
        return self.sink.write(data)


def _entries(root: Path, paths: Iterable[str]) -> list[str]:
    """``paths`` (relative to ``root``) and every folder above them, sorted: parents first."""
    out: set[str] = set()
    for rel in paths:
        parts = rel.strip("/").split("/")
        out.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return sorted(out)


def write_layer(root: Path, paths: Iterable[str], out: Path, epoch: int, what: str) -> Layer:
    """A layer tar of ``paths`` under ``root`` (and their folders): sorted, owned by root,
    modes normalised (0755 folders and executables, 0644 files), every time ``epoch``.
    A path that no longer exists under ``root`` becomes a whiteout (it was removed)."""
    with out.open("wb") as raw:
        hashing = _Hashing(raw)  # type: ignore[arg-type]
        with tarfile.open(fileobj=hashing, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            for rel in _entries(root, paths):
                path = root / rel
                if not path.exists() and not path.is_symlink():
                    folder, _, name = rel.rpartition("/")
                    info = tarfile.TarInfo(f"{folder}/.wh.{name}" if folder else f".wh.{name}")
                    info.mtime = epoch
                    tar.addfile(info, io.BytesIO(b""))
                    continue
                st = path.lstat()
                info = tarfile.TarInfo(rel)
                info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
                if stat.S_ISLNK(st.st_mode):
                    info.type, info.linkname, info.mode = (
                        tarfile.SYMTYPE,
                        str(path.readlink()),
                        0o777,
                    )
                    tar.addfile(info)
                elif stat.S_ISDIR(st.st_mode):
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                elif stat.S_ISREG(st.st_mode):
                    info.size, info.mode = st.st_size, 0o755 if st.st_mode & 0o111 else 0o644
                    with path.open("rb") as fh:
                        tar.addfile(info, fh)
                else:
                    raise HaloError(f"{path}: neither a file, a folder nor a link; not layered")
    return Layer("sha256:" + hashing.digest.hexdigest(), out, what)


def tree(root: Path, under: str) -> list[str]:
    """Every path below ``root/under`` (files, links, folders), relative to ``root``."""
    base = root / under
    out = [under]
    for dirpath, dirnames, filenames in os.walk(base):
        here = Path(dirpath).relative_to(root).as_posix()
        out += [f"{here}/{n}" for n in dirnames + filenames]
    return out


Snapshot = dict[str, tuple[int, int, int]]


def snapshot(root: Path, under: str) -> Snapshot:
    """(inode, size, mtime) of every file and link below ``root/under``: what changed since
    is what a later step wrote (writes are whole files: new ones, or atomic replacements)."""
    out: Snapshot = {}
    for rel in tree(root, under):
        if "__pycache__" in rel.split("/"):
            # Never layered (tidy removes it): bytecode that a step wrote and tidy removed
            # again became a whiteout in a folder no layer has, and docker load failed.
            continue
        st = (root / rel).lstat()
        if not stat.S_ISDIR(st.st_mode):
            out[rel] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def changed_since(root: Path, under: str, before: Snapshot) -> list[str]:
    after = snapshot(root, under)
    written = [rel for rel, key in after.items() if before.get(rel) != key]
    removed = [rel for rel in before if rel not in after]
    return sorted(written + removed)


# --- the venv made the image's ------------------------------------------------------------


def _base_python(repo: Path, fetch: FetchDebs) -> tuple[str, str]:
    """(X.Y, X.Y.Z) of the CPython the base's OS lock ships (python3.X's .deb version)."""
    from halo.pins.deblock import load_deb_lock

    lock = load_deb_lock(repo / fetch.lock)
    for deb in lock.debs:
        if m := re.fullmatch(r"python(3\.\d+)", deb.name):
            full = re.match(r"(\d+\.\d+\.\d+)", deb.version)
            if full:
                return m.group(1), full.group(1)
    raise HaloError(f"{fetch.lock}: ships no python3.X; an assembled image needs the base's")


def rewrite_scripts(venv: Path, staged_python: str) -> list[str]:
    """Scripts whose first line names the staging venv's interpreter start with the image's
    instead; their RECORD entries follow. Returns the scripts rewritten (relative to venv)."""
    rewritten: dict[str, bytes] = {}
    staged = f"#!{staged_python}".encode()
    for script in sorted((venv / "bin").iterdir()):
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        first, sep, rest = data.partition(b"\n")
        if first.rstrip() in (staged, staged + b"3") or first.startswith(staged + b" "):
            new = SHEBANG + sep + rest
            script.write_bytes(new)
            rewritten[f"bin/{script.name}"] = new
    if rewritten:
        _fix_records(venv, rewritten)
    return sorted(rewritten)


def image_direct_url(venv: Path, wheel: Path, folder: str) -> None:
    """A wheel installed from a file names where it came from (direct_url.json): the folder
    the image's own install uses (``folder``), as the Dockerfile's pip writes it, not the
    staging folder of this host."""
    name, version = wheel.name.split("-")[:2]
    (info,) = venv.glob(f"lib/python*/site-packages/{name}-{version}.dist-info")
    path = info / "direct_url.json"
    if not path.is_file():
        return
    doc = json.loads(path.read_text())
    doc["url"] = f"file://{folder}/{wheel.name}"
    data = json.dumps(doc, sort_keys=True).encode()
    path.write_bytes(data)
    _fix_records(venv, {path.relative_to(venv).as_posix(): data})


def _fix_records(venv: Path, rewritten: dict[str, bytes]) -> None:
    import base64

    for record in sorted(venv.glob("lib/python*/site-packages/*.dist-info/RECORD")):
        site = record.parent.parent
        lines, changed = record.read_text().splitlines(), False
        for i, line in enumerate(lines):
            path = line.rsplit(",", 2)[0]
            rel = os.path.relpath(os.path.normpath(site / path), venv)
            if rel in rewritten:
                data = rewritten[rel]
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                lines[i] = f"{path},sha256={digest.decode()},{len(data)}"
                changed = True
        if changed:
            record.write_text("\n".join(lines) + "\n")


def as_image_venv(venv: Path, python: str, version: str) -> None:
    """The staged venv made the one `python -m venv --without-pip /opt/venv` makes in the
    image: the base's interpreter, its pyvenv.cfg, nothing of this host."""
    for rel in UV_VENV_EXTRAS:
        (venv / rel).unlink(missing_ok=True)
    for name in ("python", f"python{python.split('.')[0]}", f"python{python}"):
        (venv / "bin" / name).unlink(missing_ok=True)
    (venv / "bin" / "python3").symlink_to("/usr/bin/python3")
    (venv / "bin" / "python").symlink_to("python3")
    (venv / "bin" / f"python{python}").symlink_to("python3")
    lib64 = venv / "lib64"
    if lib64.is_symlink() or lib64.exists():
        lib64.unlink()
    lib64.symlink_to("lib")
    (venv / "pyvenv.cfg").write_text(
        "home = /usr/bin\n"
        "include-system-site-packages = false\n"
        f"version = {version}\n"
        f"executable = /usr/bin/python{python}\n"
        "command = /usr/bin/python3 -m venv --without-pip /opt/venv\n"
    )


# --- the config the Dockerfile would give -------------------------------------------------


def dockerfile_config(text: str) -> dict[str, object]:
    """ENV, WORKDIR, SHELL and CMD of the Dockerfile's last stage, as an image config has them."""
    logical, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        logical.append(pending + line)
        pending = ""
    env: dict[str, str] = {}
    out: dict[str, object] = {}
    for line in logical:
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            env, out = {}, {}
        elif word == "ENV":
            for m in re.finditer(r'([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|\S*)', rest):
                env[m.group(1)] = m.group(2).strip('"')
        elif word == "WORKDIR":
            out["WorkingDir"] = rest.strip()
        elif word in ("CMD", "SHELL", "ENTRYPOINT"):
            key = {"CMD": "Cmd", "SHELL": "Shell", "ENTRYPOINT": "Entrypoint"}[word]
            try:
                out[key] = json.loads(rest)
            except ValueError:
                raise HaloError(
                    f"Dockerfile: {word} {rest}: only the JSON form is assembled"
                ) from None
    out["Env"] = env
    return out


def image_config(
    node: ImageNode,
    base_env: Sequence[str],
    dockerfile: str,
    layers: Sequence[str],
    history: Sequence[str],
    epoch: int,
) -> bytes:
    from halo.images.reproducible import canonical, iso

    own = dockerfile_config(dockerfile)
    env = dict(e.split("=", 1) for e in base_env)
    env.update(own.pop("Env"))  # type: ignore[arg-type]
    runtime: dict[str, object] = {
        "Env": [f"{k}={v}" for k, v in env.items()],
        "Labels": dict(sorted(node.labels.items())),
        **own,
    }
    created = iso(epoch)
    config: dict[str, object] = {
        "architecture": node.platform.arch,
        "os": node.platform.os,
        "created": created,
        "config": runtime,
        "rootfs": {"type": "layers", "diff_ids": list(layers)},
        "history": [{"created": created, "created_by": h} for h in history],
    }
    if node.platform.arch == "arm64":
        config["variant"] = "v8"
    return canonical(config)


# --- the assembly -------------------------------------------------------------------------


def assemble(
    repo: Path,
    plan: Plan,
    lock: Lock,
    store: Store,
    docker: Docker,
    kernel_wheels: Sequence[tuple[Path, str]],
) -> str:
    """Assemble the plan's image, load it under its tags, and return its image ID."""
    node = plan.target
    base = plan.node(node.base)
    assert isinstance(base, MakeBase)
    fetch = plan.node(base.deps[0])
    assert isinstance(fetch, FetchDebs)
    check_uv()
    work = work_dir(node)
    with exclusive_context(work):
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        try:
            return _assemble(repo, node, base, fetch, lock, store, docker, kernel_wheels, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _assemble(
    repo: Path,
    node: ImageNode,
    base: MakeBase,
    fetch: FetchDebs,
    lock: Lock,
    store: Store,
    docker: Docker,
    kernel_wheels: Sequence[tuple[Path, str]],
    work: Path,
) -> str:
    from halo.stack.interpreter import find_python
    from halo.stack.stage import stage_install_step, stage_wheels

    epoch = source_date_epoch()
    python, version = _base_python(repo, fetch)
    if lock.python != python:
        raise HaloError(
            f"pins/pylock.{lock.set}.toml: CPython {lock.python}; the base ships {python}"
        )
    host_python = real_interpreter(find_python(python)[0])
    root, layers_dir = work / "root", work / "layers"
    venv = root / VENV
    layers_dir.mkdir()
    for folder in WORK_DIRS:
        (root / folder).mkdir(parents=True)
    layers = [write_layer(root, WORK_DIRS, layers_dir / "0.tar", epoch, "halo: working folders")]

    # 1. The locked stack, installed by uv for the target platform.
    say(
        f"assemble {node.moving_ref}: {len(lock.artifacts)} artifacts for {lock.platform} (uv {UV_VERSION}, offline)"
    )
    stage_wheels(work / "wheels", lock, store)
    _run(["uv", "venv", "--python", host_python, "--no-project", str(venv)], "uv venv")
    staged_python = str(venv / "bin" / "python")
    require_venv(venv)
    # Exactly the plan's install (assembly_recipe), in this work folder.
    _run(
        install_argv(venv, work / "wheels", lock.platform, python),
        f"uv pip install ({lock.platform})",
    )
    tidy(venv)
    # The metadata patches, as the install step applies them, then the platform's pip check.
    install_dir = work / "install"
    install_dir.mkdir()
    stage_install_step(install_dir, repo / "patches")
    _run(
        [staged_python, str(install_dir), "patch", str(install_dir / "patches")], "metadata patches"
    )
    _run(
        ["uv", "pip", "check", "--python", staged_python, "--python-platform", lock.platform,
         "--python-version", python],
        f"uv pip check ({lock.platform})",
    )  # fmt: skip
    from halo.stack.cuda_home import assemble as cuda_home

    cuda_home(venv)
    tidy(venv)
    as_image_venv(venv, python, version)
    rewrite_scripts(venv, staged_python)
    stack = tree(root, VENV)
    layers.append(
        write_layer(
            root,
            stack,
            layers_dir / "1.tar",
            epoch,
            "halo: 1. the locked stack (uv, for the platform)",
        )
    )

    # 2. Kernels, when the image has source derivations.
    _use_host_python(venv, host_python)
    if kernel_wheels:
        before = snapshot(root, VENV)
        _install_wheels(venv, [w for w, _ in kernel_wheels], lock.platform, python)
        for w, _ in kernel_wheels:
            image_direct_url(venv, w, "/tmp/halo-kernels")
        rewrite_scripts(venv, staged_python)
        layers.append(
            write_layer(
                root,
                changed_since(root, VENV, before),
                layers_dir / "2.tar",
                epoch,
                "halo: 2. kernels",
            )
        )

    # 3. Halo, the patches applied strictly, the build record and the SBOM.
    before = snapshot(root, VENV)
    layer3 = _halo_layer(repo, node, base, lock, store, kernel_wheels, root, venv, python, work)
    rewrite_scripts(venv, staged_python)
    _use_image_python(venv, python)
    # Back on the image's interpreter, as layer 1 has it: not a change of this layer.
    restored = {f"{VENV}/bin/python3", f"{VENV}/pyvenv.cfg"}
    paths = [p for p in changed_since(root, VENV, before) if p not in restored] + layer3
    layers.append(
        write_layer(
            root, paths, layers_dir / "3.tar", epoch, "halo: 3. halo, patches, build record"
        )
    )
    no_host_paths(venv, work)
    shutil.rmtree(root)  # the layers hold it now: the disk peak is layers + the engine's copy
    return _load(docker, node, base, repo, layers, epoch)


def no_host_paths(venv: Path, work: Path) -> None:
    """Fail closed if a script or a distribution's record still names the staging folder."""
    needle = str(work).encode()
    suspects = [p for p in (venv / "bin").iterdir() if p.is_file() and not p.is_symlink()]
    suspects += sorted(venv.glob("lib/python*/site-packages/*.dist-info/*"))
    for path in suspects:
        if path.is_file() and needle in path.read_bytes():
            raise HaloError(
                f"{path.relative_to(venv)}: names the staging folder {work}; not layered"
            )


def real_interpreter(python: str) -> str:
    """The interpreter's own executable: a launcher (a pyenv shim) execs another, and a venv
    linked to the launcher would not be one (its python would run outside it)."""
    proc = subprocess.run(
        [python, "-I", "-B", "-c", "import sys; print(sys.executable)"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise HaloError(f"{python}: does not run ({proc.stderr.strip()[-200:]})")
    return proc.stdout.strip()


def require_venv(venv: Path) -> None:
    """Fail closed unless the staged venv's python is that venv: uv installs where it says."""
    proc = subprocess.run(
        # -B: -I ignores PYTHONDONTWRITEBYTECODE, and site's .pth files (setuptools'
        # _distutils_hack) would leave bytecode in the staged venv.
        [str(venv / "bin" / "python"), "-I", "-B", "-c", "import sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or Path(proc.stdout.strip()) != venv:
        raise HaloError(
            f"{venv}: its python is not this venv ({proc.stdout.strip()}); not installing"
        )


def _use_host_python(venv: Path, host_python: str) -> None:
    """Point the staged venv at this host's CPython again, for installing into it."""
    for name in ("python", "python3"):
        (venv / "bin" / name).unlink()
    (venv / "bin" / "python3").symlink_to(host_python)
    (venv / "bin" / "python").symlink_to("python3")
    cfg = venv / "pyvenv.cfg"
    cfg.write_text(
        cfg.read_text().replace("home = /usr/bin\n", f"home = {Path(host_python).parent}\n")
    )
    require_venv(venv)


def _use_image_python(venv: Path, python: str) -> None:
    (venv / "bin" / "python3").unlink()
    (venv / "bin" / "python3").symlink_to("/usr/bin/python3")
    cfg = venv / "pyvenv.cfg"
    lines = [
        li if not li.startswith("home = ") else "home = /usr/bin"
        for li in cfg.read_text().splitlines()
    ]
    cfg.write_text("\n".join(lines) + "\n")


def tidy(venv: Path) -> None:
    """What uv leaves beside an install that no image holds: its lock file, and its cache
    notes in each distribution's metadata (uv_cache.json carries the time of the install),
    with their lines in RECORD; and bytecode anything wrote (the image ships none)."""
    (venv / ".lock").unlink(missing_ok=True)
    for cache in sorted(venv.rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache)
    for note in venv.glob("lib/python*/site-packages/*.dist-info/uv_cache.json"):
        note.unlink()
        record = note.with_name("RECORD")
        if record.is_file():
            mine = f"{note.parent.name}/uv_cache.json,"
            lines = [li for li in record.read_text().splitlines() if not li.startswith(mine)]
            record.write_text("\n".join(lines) + "\n")


def _install_wheels(venv: Path, wheels: Sequence[Path], python_platform: str, python: str) -> None:
    _run(
        ["uv", "pip", "install", "--python", str(venv / "bin" / "python"),
         "--python-platform", python_platform, "--python-version", python, "--no-index",
         "--no-deps", "--no-compile", "--link-mode", "copy", "--no-cache", *map(str, wheels)],
        "uv pip install (wheels)",
    )  # fmt: skip
    tidy(venv)


def _halo_layer(
    repo: Path,
    node: ImageNode,
    base: MakeBase,
    lock: Lock,
    store: Store,
    kernel_wheels: Sequence[tuple[Path, str]],
    root: Path,
    venv: Path,
    python: str,
    work: Path,
) -> list[str]:
    """halo's wheel installed, its patches copied and applied, build.json and the SBOM;
    returns the paths outside the venv that the layer adds."""
    from halo.hashing import sha256_file, tree_files
    from halo.images.sbom import SBOM_FILE, image_sbom
    from halo.images.stamp import stamp
    from halo.images.wheel import build_wheel

    dist = work / "dist"
    wheel = build_wheel(repo, dist)
    _install_wheels(venv, [wheel], lock.platform, python)
    image_direct_url(venv, wheel, "/tmp/halo-dist")
    patches = root / "opt" / "halo" / "patches"
    for path in tree_files(repo / "patches"):
        target = patches / path.relative_to(repo / "patches")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    inputs = dist / "build-inputs.json"
    inputs.write_text(json.dumps(build_inputs(node, base.ref), indent=2, sort_keys=True) + "\n")
    wheels = [(w.name, sha) for w, sha in kernel_wheels] + [(wheel.name, sha256_file(wheel))]
    (dist / SBOM_FILE).write_text(image_sbom(lock, node.immutable_ref, node.hash, wheels))
    site = next(venv.glob(f"lib/python{python}/site-packages"))
    etc = root / "etc" / "halo"
    etc.mkdir(parents=True)
    record = stamp(inputs, etc / "build.json", etc / SBOM_FILE, True, site=site, patches=patches)
    tidy(venv)
    for cache in sorted(patches.rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache)  # loading the patch modules here may have compiled them
    states = ", ".join(f"{p['name']}={p['state']}" for p in record.get("patches", [])) or "none"  # type: ignore[union-attr]
    say(f"assemble {node.moving_ref}: patches {states}")
    return [*tree(root, "opt/halo"), *tree(root, "etc/halo")]


def _load(
    docker: Docker, node: ImageNode, base: MakeBase, repo: Path, layers: list[Layer], epoch: int
) -> str:
    from halo.hashing import sha256_bytes

    info = docker.inspect_json(base.ref)
    base_layers = list(info["RootFS"]["Layers"])
    history = [f"base {base.ref} (layer {i + 1})" for i in range(len(base_layers))]
    history += [layer.what for layer in layers]
    config = image_config(
        node,
        info["Config"].get("Env") or [],
        (repo / node.image.dockerfile).read_text(),
        [*base_layers, *(layer.diff_id for layer in layers)],
        history,
        epoch,
    )
    image_id = "sha256:" + sha256_bytes(config)
    size = sum(layer.path.stat().st_size for layer in layers)
    say(f"assemble {node.moving_ref}: docker load ({size >> 20} MiB of new layers)")
    stream_load(
        docker,
        config,
        [node.immutable_ref, node.moving_ref],
        [*((d, None) for d in base_layers), *((layer.diff_id, layer.path) for layer in layers)],
        epoch,
    )
    got = docker.image_id(node.immutable_ref)
    if got != image_id:
        raise HaloError(f"{node.immutable_ref}: loaded as {got}, expected {image_id}")
    say(f"assemble {node.moving_ref}: {image_id[:19]} ({node.platform})")
    return image_id


def stream_load(
    docker: Docker,
    config: bytes,
    tags: Sequence[str],
    layers: Sequence[tuple[str, Path | None]],
    epoch: int,
) -> None:
    """`docker load` of the image (halo.images.reproducible.docker_archive's layout), written
    straight into the engine: no archive on disk beside the layers. A layer without a path is
    one the engine has (the base's)."""
    from halo.hashing import sha256_bytes

    config_name = sha256_bytes(config) + ".json"
    names = [diff_id.removeprefix("sha256:") + "/layer.tar" for diff_id, _ in layers]
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": list(tags), "Layers": names}]
    ).encode()
    argv = [docker.exe, "load", "--quiet"]
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdin is not None
    try:
        with tarfile.open(fileobj=proc.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for name, data in ((config_name, config), ("manifest.json", manifest)):
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), epoch, 0o644
                tar.addfile(info, io.BytesIO(data))
            for name, (_, path) in zip(names, layers, strict=True):
                if path is None:
                    continue
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = path.stat().st_size, epoch, 0o644
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
    except BrokenPipeError:
        pass
    # communicate() flushes and closes stdin itself: closed here first, its flush raised
    # "flush of closed file" after docker had loaded every layer.
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise HaloError(f"docker load: failed: {err.decode(errors='replace').strip()[-300:]}")
