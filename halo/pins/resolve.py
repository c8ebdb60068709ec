"""Resolve a pin set into a Lock. The network side is one class, `UvResolver`, behind `Resolver`.

uv runs twice per set. First for annotated requirements (who pulls in whom), with the
committed lock's pins as preferences, as uv lock and pip-compile do: a lock moves only when
its inputs change or an upgrade is asked for, never because the index learned something
(a mirror may serve a file later with an earlier upload time). Then for PEP 751 output (the
candidate files, their sha256 and sizes), constrained to exactly the first resolution, so
the two cannot disagree. Both are turned into a Lock by `build_lock`, a pure function,
which keeps only the artifact the target installs and drops every URL.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlparse

from halo.errors import HaloError
from halo.pins.artifacts import choose
from halo.pins.inputs import SetInputs
from halo.pins.lockfile import Artifact, Lock, Package, normalize
from halo.report import say

# uv settings that must not leak in from the caller's environment; the resolution is
# decided by pins/ alone. Cache, TLS and network tuning may still come from the user.
UV_ENV_KEEP = frozenset(
    {"UV_CACHE_DIR", "UV_NATIVE_TLS", "UV_HTTP_TIMEOUT", "UV_CONCURRENT_DOWNLOADS", "UV_OFFLINE"}
)
PIN_RE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(?P<version>\S+)")


@dataclass(frozen=True)
class Resolution:
    """What the resolver said, unprocessed."""

    pylock: str
    annotated: str


@dataclass(frozen=True)
class Upgrade:
    """What may move past the committed lock: everything, or the named packages."""

    all: bool = False
    packages: frozenset[str] = frozenset()

    def allows(self, name: str) -> bool:
        return self.all or normalize(name) in {normalize(p) for p in self.packages}

    def unknown(self, locks: Iterable[Lock | None]) -> list[str]:
        """Pure: the named packages that none of these locks holds (a typo moves nothing)."""
        if self.all:
            return []
        held = {normalize(p.name) for lock in locks if lock for p in lock.packages}
        return sorted(name for name in self.packages if normalize(name) not in held)

    def uv_args(self) -> list[str]:
        # uv's own flags too: they also refresh its cached index pages for what may move.
        if self.all:
            return ["--upgrade"]
        return [a for name in sorted(self.packages) for a in ("--upgrade-package", name)]


NO_UPGRADE = Upgrade()


@dataclass(frozen=True)
class Preferences:
    """The committed lock's pins a re-resolution keeps where the inputs still allow them.

    Soft: uv drops a preference that no longer satisfies the inputs.
    """

    pins: tuple[tuple[str, str], ...] = ()
    upgrade: Upgrade = Upgrade()

    def requirements_txt(self) -> str:
        """uv reads an existing `-o requirements.txt` as its preferences."""
        return "".join(f"{name}=={version}\n" for name, version in self.pins)


def preferences(lock: Lock | None, upgrade: Upgrade = Upgrade()) -> Preferences:
    """Pure: the committed lock (if any) -> the pins to prefer, minus what may be upgraded."""
    if lock is None:
        return Preferences(upgrade=upgrade)
    pins = tuple(
        (p.name, p.version)
        for p in sorted(lock.packages, key=lambda p: p.name)
        if not upgrade.allows(p.name)
    )
    return Preferences(pins=pins, upgrade=upgrade)


def exact_pins(annotated: str) -> str:
    """Pure: annotated requirements -> `name==version` constraints that allow only them."""
    return "".join(
        f"{name}=={version}\n" for name, (version, _) in parse_annotated(annotated).items()
    )


class Resolver(Protocol):
    def resolve(
        self, inputs: SetInputs, pins_dir: Path, prefer: Preferences = Preferences()
    ) -> Resolution: ...


def uv_args(
    inputs: SetInputs, indexes: list[str], substitutes: list[Path], excludes: Path | None
) -> list[str]:
    """The full `uv pip compile` argument list (minus output flags), every behaviour explicit."""
    args = ["pip", "compile", "--no-config", "--quiet"]
    args += [f.path for f in inputs.requirements]
    for f in inputs.constraints:
        args += ["--constraints", f.path]
    for f in inputs.overrides:
        args += ["--overrides", f.path]
    if excludes is not None:
        args += ["--excludes", str(excludes)]
    args += ["--python-version", inputs.python, "--python-platform", inputs.platform]
    args += ["--exclude-newer", inputs.exclude_newer]
    args += ["--resolution", "highest", "--index-strategy", "first-index"]
    args += ["--prerelease", "disallow"]
    for name in inputs.prerelease:
        args += ["--prerelease-package", f"{name}=allow"]
    if indexes:
        args += ["--default-index", indexes[0]]
    for url in indexes[1:]:
        args += ["--index", url]
    for folder in substitutes:
        args += ["--find-links", str(folder)]
    return args


def uv_indexes(indexes: list[str]) -> tuple[list[str], dict[str, str]]:
    """The indexes as uv takes them, and the environment that carries their credentials.

    One with a user part (``https://user:TOKEN@host/simple/``) becomes a named index
    (``halo0=https://host/simple/``) whose credentials uv reads from its own
    ``UV_INDEX_HALO0_USERNAME`` / ``_PASSWORD``: never on the command line (which ``ps`` shows)
    and never in a line uv or halo prints.
    """
    from halo.urls import split_userinfo

    args, env = [], {}
    for i, url in enumerate(indexes):
        bare, creds = split_userinfo(url)
        if creds is None:
            args.append(url)
            continue
        args.append(f"halo{i}={bare}")
        env[f"UV_INDEX_HALO{i}_USERNAME"] = creds.username
        env[f"UV_INDEX_HALO{i}_PASSWORD"] = creds.password
    return args, env


def _uv_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k in UV_ENV_KEEP}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    env["UV_NO_PROGRESS"] = "1"
    return env


def _uv_failure(inputs: SetInputs, stderr: str, substitutes: list[Path]) -> HaloError:
    """One line: uv's error and its first cause (uv's full explanation is printed above it)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    error = next((ln for ln in lines if ln.startswith("error:")), lines[0] if lines else "failed")
    cause = next((ln for ln in lines if ln.startswith("cause:")), "")
    detail = f"{error.removeprefix('error:').strip()}; {cause}" if cause else error
    hint = ""
    if inputs.substitutes and not substitutes:
        hint = " (this set takes artifacts from substitute folders and none is configured: HALO_SUBSTITUTES)"
    return HaloError(
        f"pins/sets.toml: [set.{inputs.name}]: uv could not resolve it: {detail}{hint}"
    )


def _indexes(index_urls: Callable[[], list[str]]) -> list[str]:
    """The configured indexes; [] means uv's own default (the same public index as pip's)."""
    try:
        return index_urls()
    except ModuleNotFoundError:
        # No index configured and no pip here to ask for its default (e.g. a uv-made venv).
        return []


@dataclass(frozen=True)
class UvResolver:
    """Runs uv against the configured index (halo.sources); the only code here that does I/O."""

    uv: str = "uv"

    def resolve(
        self, inputs: SetInputs, pins_dir: Path, prefer: Preferences = Preferences()
    ) -> Resolution:
        from halo.sources import index_urls, substitute_dirs

        uv = shutil.which(self.uv)
        if uv is None:
            raise HaloError(f"'{self.uv}' not found on PATH: `halo pins lock` resolves with uv")
        substitutes = substitute_dirs() if inputs.substitutes else []
        with tempfile.TemporaryDirectory(prefix="halo-pins-") as tmp:
            excludes = None
            if inputs.exclude:
                excludes = Path(tmp) / "excludes.txt"
                excludes.write_text("".join(f"{name}\n" for name in inputs.exclude))
            indexes, creds_env = uv_indexes(_indexes(index_urls))
            base = uv_args(inputs, indexes, substitutes, excludes)
            annotated = Path(tmp) / "requirements.txt"
            annotated.write_text(prefer.requirements_txt())
            annotate = ["--no-header", "--annotation-style", "split", "-o", str(annotated)]
            self._run(
                uv,
                [*base, *prefer.upgrade.uv_args(), *annotate],
                inputs,
                pins_dir,
                substitutes,
                creds_env,
            )
            # The file list for exactly that resolution: every package pinned as a constraint.
            resolved = Path(tmp) / "resolved.txt"
            resolved.write_text(exact_pins(annotated.read_text()))
            pylock = Path(tmp) / "pylock.toml"
            exact = ["--constraints", str(resolved), "-o", str(pylock)]
            self._run(uv, [*base, *exact], inputs, pins_dir, substitutes, creds_env)
            return Resolution(pylock=pylock.read_text(), annotated=annotated.read_text())

    @staticmethod
    def _run(
        uv: str,
        args: list[str],
        inputs: SetInputs,
        pins_dir: Path,
        substitutes: list[Path],
        creds_env: dict[str, str],
    ) -> None:
        proc = subprocess.run(
            [uv, *args],
            cwd=pins_dir,
            env={**_uv_env(), **creds_env},
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            say(proc.stderr.rstrip())
            raise _uv_failure(inputs, proc.stderr, substitutes)


def parse_annotated(text: str) -> dict[str, tuple[str, list[str]]]:
    """Annotated requirements -> {name: (version, [what pulls it in])}; '-r FILE' for roots."""
    out: dict[str, tuple[str, list[str]]] = {}
    current: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if not raw[0].isspace() and not line.startswith("#"):
            m = PIN_RE.match(line)
            if not m:
                raise HaloError(f"uv output: unexpected requirement line '{line}'")
            current = normalize(m["name"])
            out[current] = (m["version"], [])
            continue
        if current is None or not line.startswith("#"):
            continue
        via = line.lstrip("#").strip()
        via = via.removeprefix("via").strip()
        if via:
            out[current][1].append(via)
    return out


def _via_names(via: list[str]) -> set[str]:
    # '-r FILE', '-c FILE', '--override FILE': input files, not packages.
    return {normalize(v.split("[", 1)[0]) for v in via if not v.startswith("-")}


def _filename(entry: dict) -> str:
    if isinstance(entry.get("name"), str):
        return entry["name"]
    url = entry.get("url") or entry.get("path")
    if not isinstance(url, str):
        raise HaloError("uv output: a file entry has neither name nor url")
    return unquote(urlparse(url).path.rsplit("/", 1)[-1])


def _artifact(entry: dict, local_size: Callable[[str], int | None]) -> Artifact:
    sha = (entry.get("hashes") or {}).get("sha256")
    if not isinstance(sha, str):
        raise HaloError(f"uv output: {_filename(entry)} has no sha256")
    size = entry.get("size")
    if size is None and isinstance(entry.get("url"), str) and entry["url"].startswith("file:"):
        # Files from substitute folders come without a size; the folder has it.
        size = local_size(unquote(urlparse(entry["url"]).path))
    if not isinstance(size, int):
        raise HaloError(f"uv output: {_filename(entry)} has no size")
    return Artifact(file=_filename(entry), sha256=sha, size=size)


def _kept_file(
    previous: Lock | None, name: str, version: str, offered: dict[str, dict], choosable: Callable
) -> str | None:
    """The committed lock's file for this very release, if still offered with the same hash
    and installable: a wheel the index adds later for a locked version does not move it."""
    old = previous.package(name) if previous else None
    if old is None or old.version != version or len(old.artifacts) != 1:
        return None
    art = old.artifacts[0]
    entry = offered.get(art.file)
    sha = (entry.get("hashes") or {}).get("sha256") if entry else None
    return art.file if sha == art.sha256 and choosable(art.file) else None


def build_lock(
    inputs: SetInputs,
    resolution: Resolution,
    local_size: Callable[[str], int | None],
    previous: Lock | None = None,
) -> Lock:
    """Pure: the resolver's output -> the Lock, one chosen artifact per package, no URLs."""
    try:
        pylock = tomllib.loads(resolution.pylock)
    except tomllib.TOMLDecodeError as exc:
        raise HaloError(f"uv output: pylock.toml is not TOML ({exc})") from None
    graph = parse_annotated(resolution.annotated)
    _, minor = inputs.glibc
    target = (inputs.python, minor, inputs.arch)
    packages = []
    for raw in pylock.get("packages", []):
        name = normalize(raw["name"])
        version = str(raw["version"])
        if name not in graph or graph[name][0] != version:
            raise HaloError(f"uv output: the two resolutions disagree on {name} {version}")
        wheels = {_filename(w): w for w in raw.get("wheels", [])}
        sdist = raw.get("sdist")
        sdist_name = _filename(sdist) if sdist else None
        offered = {**wheels, **({sdist_name: sdist} if sdist_name else {})}

        def installable(file: str, wheels: dict = wheels) -> bool:
            # An sdist builds anywhere; a wheel only where its tags fit the target.
            return file not in wheels or choose([file], None, *target) == file

        chosen = _kept_file(previous, name, version, offered, installable) or choose(
            sorted(wheels), sdist_name, *target
        )
        if chosen is None:
            raise HaloError(
                f"pins/sets.toml: [set.{inputs.name}]: {name} {version} has no file that installs "
                f"on CPython {inputs.python} {inputs.platform}"
            )
        entry = wheels.get(chosen) or sdist
        packages.append(
            Package(
                name=name,
                version=version,
                artifacts=(_artifact(entry, local_size),),
                # What this package needs: those whose 'via' names it.
                dependencies=tuple(
                    sorted(dep for dep, (_, via) in graph.items() if name in _via_names(via))
                ),
            )
        )
    return Lock(
        set=inputs.name,
        python=inputs.python,
        platform=inputs.platform,
        inputs_sha256=inputs.sha256(),
        packages=tuple(sorted(packages, key=lambda p: p.name)),
        extra={
            "exclude-newer": inputs.exclude_newer,
            "requirements": list(inputs.top_level),
            "excluded": list(inputs.exclude),
            "allow-prerelease": list(inputs.prerelease),
            "overrides": list(inputs.override_lines),
        },
    )


def lock_header(inputs: SetInputs) -> str:
    return (
        f"Generated by `halo pins lock {inputs.name}` from pins/sets.toml; do not edit by hand.\n"
        f"CPython {inputs.python}, {inputs.platform}, index as of {inputs.exclude_newer}.\n"
        "Files are named, never located: see halo/sources.py for where they are fetched from."
    )


def file_size(path: str) -> int | None:
    p = Path(path)
    return p.stat().st_size if p.is_file() else None
