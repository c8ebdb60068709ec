"""The Docker edge: every call to the docker CLI, or to the engine's API, goes through here.

Builds use BuildKit: `docker buildx build --load` where the buildx plugin exists, else the
engine's built-in BuildKit (`DOCKER_BUILDKIT=1 docker build`), which only CLIs older than 23
still offer. A newer CLI without buildx can still inspect, tag, load and run, so those calls
use the first docker on PATH and only builds go looking for a BuildKit-capable one.

Looking an image up is what a no-op build does, three times; each docker CLI call costs a
process start and an API negotiation (50-100 ms here), so lookups ask the engine's API on its
unix socket directly (a few ms) and fall back to the CLI when the engine is elsewhere (a tcp or
ssh DOCKER_HOST, a docker context), where the CLI knows how to reach it.
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import re
import socket
import subprocess
import tempfile
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from halo.errors import HaloError

# How BuildKit describes the record of a build context it synced from a client.
CONTEXT_RECORD = "local source for context"


def _run(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    check: bool = True,
    capture: bool = True,
) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(list(argv), env=env, text=True, capture_output=capture, check=False)
    except FileNotFoundError:
        raise HaloError(
            f"{argv[0]}: not found; install Docker (docker.io) and start dockerd"
        ) from None
    if check and proc.returncode != 0:
        err = (proc.stderr or "").strip().splitlines()
        raise HaloError(
            f"{' '.join(argv[:3])}: failed: {err[-1] if err else f'exit {proc.returncode}'}"
        )
    return proc


API = "/v1.41"  # Docker 20.10's API version; later engines still serve it


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def engine_socket() -> str | None:
    """The engine's unix socket when the CLI would use it too; None for anything else."""
    if os.environ.get("DOCKER_CONTEXT"):
        return None
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not host.startswith("unix://"):
        return None
    config = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"
    try:
        if json.loads(config.read_text()).get("currentContext") not in (None, "", "default"):
            return None
    except (OSError, ValueError, AttributeError):
        pass
    return host.removeprefix("unix://")


def _api_get(path: str) -> tuple[int, bytes] | None:
    """(status, body) of a GET on the engine's API; None when it cannot be asked directly."""
    sock = engine_socket()
    if sock is None:
        return None
    conn = _UnixConnection(sock)
    try:
        conn.request("GET", API + path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    except (OSError, http.client.HTTPException):
        return None  # not there: the CLI says why, in its words
    finally:
        conn.close()


def _docker_candidates() -> list[str]:
    if override := os.environ.get("HALO_DOCKER"):
        return [override]
    found = []
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        exe = Path(entry) / "docker"
        try:
            usable = exe.is_file() and os.access(exe, os.X_OK)
        except OSError:  # a PATH entry this user may not enter holds no docker for it
            usable = False
        if usable and str(exe) not in found:
            found.append(str(exe))
    return found


@dataclass(frozen=True)
class Builder:
    exe: str
    buildx: bool

    def argv(self, load: bool = True) -> list[str]:
        if self.buildx:
            return [self.exe, "buildx", "build", *(["--load"] if load else [])]
        return [self.exe, "build"]


@dataclass(frozen=True)
class Docker:
    exe: str

    @classmethod
    def discover(cls) -> Docker:
        cands = _docker_candidates()
        if not cands:
            raise HaloError("docker: not found on PATH; install Docker and start dockerd")
        return cls(cands[0])

    @functools.cached_property
    def builder(self) -> Builder:
        for exe in _docker_candidates():
            if _run([exe, "buildx", "version"], check=False).returncode == 0:
                return Builder(exe, buildx=True)
            version = _run(
                [exe, "version", "--format", "{{.Client.Version}}"], check=False
            ).stdout.strip()
            if version and int(version.split(".")[0]) < 23:
                return Builder(exe, buildx=False)
        raise HaloError(
            "docker: no BuildKit builder found (need the buildx plugin, or a docker CLI older than 23)"
        )

    def ping(self) -> None:
        answer = _api_get("/_ping")
        if answer is not None and answer[0] == 200:
            return
        proc = _run([self.exe, "version", "--format", "{{.Server.Version}}"], check=False)
        if proc.returncode != 0:
            raise HaloError(
                "docker: the engine is not reachable; start dockerd (or set DOCKER_HOST)"
            )

    def find(self, ref: str) -> dict | None:  # type: ignore[type-arg]
        """`docker image inspect` of one image as a dict, or None when ``ref`` is not here."""
        answer = _api_get(f"/images/{urllib.parse.quote(ref, safe='/:@')}/json")
        if answer is not None and answer[0] in (200, 404):
            status, body = answer
            return json.loads(body) if status == 200 else None
        proc = _run([self.exe, "image", "inspect", ref], check=False)
        if proc.returncode != 0:
            return None
        try:
            (info,) = json.loads(proc.stdout)
        except ValueError:
            raise HaloError(f"docker image inspect {ref}: unexpected output") from None
        return info  # type: ignore[no-any-return]

    def image_id(self, ref: str) -> str | None:
        info = self.find(ref)
        return str(info["Id"]) if info else None

    def inspect(self, ref: str, fmt: str) -> str:
        return _run([self.exe, "image", "inspect", "--format", fmt, ref]).stdout.strip()

    def inspect_json(self, ref: str) -> dict:  # type: ignore[type-arg]
        """`docker image inspect` of one image, as a dict; a missing image is an error."""
        info = self.find(ref)
        if info is None:
            raise HaloError(f"{ref}: no such image here")
        return info

    def id_and_label(self, ref: str, label: str) -> tuple[str, str] | None:
        """(image ID, value of ``label``); None when ``ref`` is not here."""
        info = self.find(ref)
        if info is None:
            return None
        labels = (info.get("Config") or {}).get("Labels") or {}
        return str(info["Id"]), str(labels.get(label, ""))

    def layers(self, ref: str) -> list[str]:
        return list(self.inspect_json(ref)["RootFS"]["Layers"])

    def refs(self, repository: str) -> list[str]:
        """Local tags of a repository (a pattern such as ``halo-base/*`` works too), sorted."""
        fmt = "{{.Repository}}:{{.Tag}}"
        return sorted(_run([self.exe, "images", "--format", fmt, repository]).stdout.split())

    def tag(self, src: str, dst: str) -> None:
        _run([self.exe, "tag", src, dst])

    def remove(self, ref: str) -> None:
        _run([self.exe, "image", "rm", "--force", ref], check=False)

    def load(self, tar: Path) -> str:
        with tar.open("rb") as fh:
            proc = subprocess.run(
                [self.exe, "load", "--quiet"], stdin=fh, text=True, capture_output=True, check=False
            )
        if proc.returncode != 0:
            raise HaloError(f"docker load {tar.name}: failed: {proc.stderr.strip()}")
        return proc.stdout.strip()

    def build(
        self,
        context: Path,
        dockerfile: Path,
        tags: Sequence[str],
        build_args: Mapping[str, str],
        labels: Mapping[str, str],
        network: str = "none",
        output: Path | None = None,
        no_cache: bool = False,
    ) -> str:
        """Run a BuildKit build (log streamed to the terminal); return the image ID.

        With ``output``, the final stage's files are exported to that folder instead of an image.
        The ID file lives outside the context: writing into the context would change it.
        """
        with tempfile.TemporaryDirectory(prefix="halo-iid-") as tmp:
            iidfile = Path(tmp) / "iid"
            argv = build_argv(
                self.builder,
                context,
                dockerfile,
                tags,
                build_args,
                labels,
                network,
                iidfile,
                output,
                no_cache=no_cache,
            )
            run_build(argv, {"DOCKER_BUILDKIT": "1"}, None, dockerfile.name)
            return "" if output else iidfile.read_text().strip()

    def prune_build_cache(self, keep_contexts: bool = False) -> None:
        """Drop BuildKit's unused cache records; with ``keep_contexts``, all but the synced
        build contexts, so the next build on one sends only the files that changed."""
        argv = [self.exe, "builder", "prune", "--force"]
        if keep_contexts:
            fmt = "{{json .BuildCache}}"
            listed = _run([self.exe, "system", "df", "--verbose", "--format", fmt]).stdout
            drop = [
                str(r["ID"]).rstrip("*")  # docker appends a star to some IDs
                for r in json.loads(listed or "[]") or []
                if r.get("Description") != CONTEXT_RECORD
            ]
            if not drop:
                return
            # The engine's only filter that picks records by name (a regular expression);
            # docker 20.10 gives every record the type "regular", so type= cannot.
            argv += ["--filter", f"id=^({'|'.join(map(re.escape, drop))})$"]
        _run(argv)

    def pull(self, ref: str) -> None:
        """Pull (a staged digest, say) through the engine, with docker's own credentials."""
        _run([self.exe, "pull", "--quiet", ref])

    def run(self, argv: Sequence[str], capture: bool = False) -> subprocess.CompletedProcess[str]:
        return _run([self.exe, "run", *argv], check=False, capture=capture)


def build_argv(
    builder: Builder,
    context: Path,
    dockerfile: Path,
    tags: Sequence[str],
    build_args: Mapping[str, str],
    labels: Mapping[str, str],
    network: str,
    iidfile: Path,
    output: Path | None = None,
    no_cache: bool = False,
) -> list[str]:
    argv = builder.argv(load=output is None) + (["--no-cache"] if no_cache else [])
    argv += ["--progress", "plain", "--network", network]
    argv += ["--output", f"type=local,dest={output}"] if output else ["--iidfile", str(iidfile)]
    argv += ["-f", str(dockerfile)]
    for k, v in sorted(build_args.items()):
        argv += ["--build-arg", f"{k}={v}"]
    for k, v in sorted(labels.items()):
        argv += ["--label", f"{k}={v}"]
    for t in tags:
        argv += ["-t", t]
    return [*argv, str(context)]


def run_build(argv: Sequence[str], env: Mapping[str, str], cwd: str | None, what: str) -> None:
    """Run one build command (its log streamed to the terminal), exactly as given."""
    try:
        proc = subprocess.run(list(argv), env={**os.environ, **env}, cwd=cwd, check=False)
    except FileNotFoundError:
        raise HaloError(
            f"{argv[0]}: not found; install Docker (docker.io) and start dockerd"
        ) from None
    if proc.returncode != 0:
        raise HaloError(
            f"docker build ({what}): failed with exit {proc.returncode}; see the build log above"
        )
