"""The Docker edge: every call to the docker CLI goes through here.

Builds use BuildKit: `docker buildx build --load` where the buildx plugin exists, else the
engine's built-in BuildKit (`DOCKER_BUILDKIT=1 docker build`), which only CLIs older than 23
still offer. A newer CLI without buildx can still inspect, tag, load and run, so those calls
use the first docker on PATH and only builds go looking for a BuildKit-capable one.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from halo.errors import HaloError


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


def _docker_candidates() -> list[str]:
    if override := os.environ.get("HALO_DOCKER"):
        return [override]
    found = []
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        exe = Path(entry) / "docker"
        if exe.is_file() and os.access(exe, os.X_OK) and str(exe) not in found:
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
        proc = _run([self.exe, "version", "--format", "{{.Server.Version}}"], check=False)
        if proc.returncode != 0:
            raise HaloError(
                "docker: the engine is not reachable; start dockerd (or set DOCKER_HOST)"
            )

    def image_id(self, ref: str) -> str | None:
        proc = _run([self.exe, "image", "inspect", "--format", "{{.Id}}", ref], check=False)
        return proc.stdout.strip() if proc.returncode == 0 else None

    def inspect(self, ref: str, fmt: str) -> str:
        return _run([self.exe, "image", "inspect", "--format", fmt, ref]).stdout.strip()

    def inspect_json(self, ref: str) -> dict:  # type: ignore[type-arg]
        """`docker image inspect` of one image, as a dict."""
        out = _run([self.exe, "image", "inspect", ref]).stdout
        try:
            (info,) = json.loads(out)
        except ValueError:
            raise HaloError(f"docker image inspect {ref}: unexpected output") from None
        return info  # type: ignore[no-any-return]

    def id_and_label(self, ref: str, label: str) -> tuple[str, str] | None:
        """(image ID, value of ``label``) in one call; None when ``ref`` is not here."""
        fmt = f'{{{{.Id}}}} {{{{index .Config.Labels "{label}"}}}}'
        proc = _run([self.exe, "image", "inspect", "--format", fmt, ref], check=False)
        if proc.returncode != 0:
            return None
        image_id, _, value = proc.stdout.strip().partition(" ")
        return image_id, value.strip()

    def layers(self, ref: str) -> list[str]:
        return self.inspect(ref, "{{range .RootFS.Layers}}{{println .}}{{end}}").split()

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
            )
            if no_cache:
                argv.insert(len(self.builder.argv(load=output is None)), "--no-cache")
            env = {**os.environ, "DOCKER_BUILDKIT": "1"}
            proc = subprocess.run(argv, env=env, check=False)
            if proc.returncode != 0:
                raise HaloError(
                    f"docker build ({dockerfile.name}): failed with exit {proc.returncode}; see the build log above"
                )
            return "" if output else iidfile.read_text().strip()

    def push(self, ref: str) -> None:
        _run([self.exe, "push", ref])

    def remote_config_digest(self, ref: str) -> str | None:
        """The config digest (= image ID) a registry tag points at, or None when it doesn't exist."""
        proc = _run([self.exe, "manifest", "inspect", "--insecure", ref], check=False)
        if proc.returncode != 0:
            if "no such manifest" in proc.stderr or "not found" in proc.stderr.lower():
                return None
            raise HaloError(f"{ref}: registry did not answer ({proc.stderr.strip()})")
        manifest = json.loads(proc.stdout)
        if "config" not in manifest:
            raise HaloError(f"{ref}: is a manifest list, not an image this toolchain pushed")
        return str(manifest["config"]["digest"])

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
) -> list[str]:
    argv = [*builder.argv(load=output is None), "--progress", "plain", "--network", network]
    argv += ["--output", f"type=local,dest={output}"] if output else ["--iidfile", str(iidfile)]
    argv += ["-f", str(dockerfile)]
    for k, v in sorted(build_args.items()):
        argv += ["--build-arg", f"{k}={v}"]
    for k, v in sorted(labels.items()):
        argv += ["--label", f"{k}={v}"]
    for t in tags:
        argv += ["-t", t]
    return [*argv, str(context)]
