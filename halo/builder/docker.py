"""Build one source tree into one wheel in Docker: images/builder/Dockerfile, ``--network none``.

The context holds exactly what the build may use: ``src/`` (the verified, patched tree),
``wheels/`` and ``install/`` (the toolchain's locked wheels and the images' install step,
which also assembles CUDA_HOME when nvcc is among them), and ``env/`` (the derivation's
environment and the git/curl/wget guard of the native builder). Only ``/out`` comes back.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from halo.builder.native import write_guard
from halo.builder.toolchain import Toolchain, builder_key, stage_wheels
from halo.errors import HaloError
from halo.images.context import ContextSync
from halo.images.docker import Docker
from halo.images.realise.build import context_dir, exclusive_context
from halo.stack.stage import stage_install_step
from halo.store.store import Store

DOCKERFILE = Path("images/builder/Dockerfile")
REFUSED_LOG = "/tmp/halo-refused.log"  # inside the build container
# The first-object probe: torch's cpp_extension compiles through $PYTORCH_NVCC, this script.
# It compiles one object with the toolchain's nvcc, hands the object and its command line back
# in /out, then fails the build on purpose; the Dockerfile lets a build end so only when that
# record is there. Calls that compile nothing (nvcc --version) pass straight through. With
# $HALO_PROBE_SOURCE (the pin's `probe`), the object is that source's: every other compile
# before it leaves an empty stand-in (and its dependency file, which ninja reads), so the
# build goes on to it and stops there, before anything links. $HALO_PROBE_FLAGS (the pin's
# `probe-defines`, as -D flags) go to that one compile alone.
PROBE_RECORD, PROBE_OBJECT = "first-nvcc.txt", "first.o"
PROBE_SOURCE, PROBE_FLAGS = "HALO_PROBE_SOURCE", "HALO_PROBE_FLAGS"
_NVCC_ONCE = f"""#!/bin/sh
nvcc="$CUDA_HOME/bin/nvcc"
case " $* " in *" -c "*) ;; *) exec "$nvcc" "$@" ;; esac
out="" dep="" chosen="" prev=""
for arg in "$@"; do
  [ "$prev" = "-o" ] && out="$arg"
  [ "$prev" = "--dependency-output" ] && dep="$arg"
  case "$arg" in *"/${{{PROBE_SOURCE}:-/}}") chosen=1 ;; esac
  prev="$arg"
done
if [ -n "${{{PROBE_SOURCE}:-}}" ] && [ -z "$chosen" ]; then
  : > "$out"
  [ -z "$dep" ] || printf '%s:\\n' "$out" > "$dep"
  exit 0
fi
start=$(date +%s)
# Unquoted on purpose: one -D flag per word.
"$nvcc" "$@" ${{{PROBE_FLAGS}:-}}
rc=$?
end=$(date +%s)
[ "$rc" -eq 0 ] && [ -n "$out" ] && [ -f "$out" ] && cp "$out" /out/{PROBE_OBJECT}
printf 'rc=%s nvcc=%s seconds=%s\\n%s\\n' "$rc" "$nvcc" "$((end - start))" \\
  "$* ${{{PROBE_FLAGS}:-}}" \\
  > /out/{PROBE_RECORD}
exit 99
"""


def _sh_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def stage_context(
    ctx: Path,
    tc: Toolchain,
    src: Path,
    env: Mapping[str, str],
    store: Store,
    patches_dir: Path,
    probe: bool = False,
    probe_source: str = "",
    probe_defines: tuple[str, ...] = (),
) -> None:
    shutil.copytree(src, ctx / "src", symlinks=True)
    stage_wheels(ctx / "wheels", tc.requirements, store)
    stage_install_step(ctx / "install", patches_dir)
    (ctx / "env").mkdir()
    if probe:
        once = ctx / "env" / "nvcc-once"
        once.write_text(_NVCC_ONCE)
        once.chmod(0o755)
        env = {**env, "PYTORCH_NVCC": "/tmp/halo-env/nvcc-once"}
        if probe_source:
            env[PROBE_SOURCE] = probe_source
        if probe_defines:
            env[PROBE_FLAGS] = " ".join(f"-D{m}" for m in probe_defines)
    (ctx / "env" / "build.env").write_text(
        "".join(f"{k}={_sh_quote(v)}\n" for k, v in sorted(env.items()))
    )
    write_guard(ctx / "env" / "guard", Path(REFUSED_LOG))


@dataclass(frozen=True)
class DockerBuild:
    """One source tree's build in the builder image: what the wheel build and the first-object
    probe share."""

    tc: Toolchain
    src: Path  # the verified, patched tree
    subdirectory: str
    env: Mapping[str, str]  # the derivation's environment
    parallel: Mapping[str, str]  # MAX_JOBS, NVCC_THREADS
    work: Path  # a folder of this build's own; ctx/ and out/ are made in it
    repo: Path
    docker: Docker
    store: Store
    label: str  # the derivation's name, for messages
    probe_source: str = ""  # the source the probe compiles (the pin's `probe`; "": the first)
    probe_defines: tuple[str, ...] = ()  # the pin's `probe-defines`, for that compile alone

    def run(self, probe: bool = False) -> Path:
        staged, out = self.work / "ctx", self.work / "out"
        stage_context(
            staged, self.tc, self.src, self.env, self.store, self.repo / "patches", probe,
            self.probe_source, self.probe_defines,
        )  # fmt: skip
        parallel = {**self.parallel, "MAX_JOBS": "1"} if probe else dict(self.parallel)
        ctx = toolchain_context(self.tc)
        # One build in the toolchain's context at a time; it is brought to this build's files.
        with exclusive_context(ctx):
            ContextSync(ctx).mirror(staged, fresh=("src", "env", "install"))
            self.docker.build(
                context=ctx,
                dockerfile=self.repo / DOCKERFILE,
                tags=[],
                build_args={
                    "BUILDER": self.tc.base_ref,
                    "PYTHON": self.tc.python,
                    "SUBDIR": self.subdirectory or ".",
                    **parallel,
                },
                labels={},
                network="none",
                output=out,
            )
        return out


def toolchain_context(tc: Toolchain) -> Path:
    """The build context of every derivation on ``tc``, in one place per engine: BuildKit keeps
    a synced context by its path and sends only what changed, so the toolchain's 3 GB of wheels
    go over once, not once per derivation (three copies, 15 s each, in the kernels' builds)."""
    return context_dir(f"derivations-{builder_key(tc)[:16]}")


def build_wheel(job: DockerBuild) -> Path:
    wheels = sorted(job.run().glob("*.whl"))
    if len(wheels) != 1:
        raise HaloError(
            f"derivation {job.label}: expected one wheel from the build, "
            f"got {[w.name for w in wheels]}"
        )
    return wheels[0]


def first_object(job: DockerBuild) -> tuple[str, Path]:
    """(the probe's record, the object file): the build run up to its first nvcc object, on one
    job so that "first" is one object."""
    out = job.run(probe=True)
    record, obj = out / PROBE_RECORD, out / PROBE_OBJECT
    if not record.is_file():
        raise HaloError(f"derivation {job.label}: the build finished without compiling with nvcc")
    text = record.read_text()
    if not text.startswith("rc=0 ") or not obj.is_file():
        raise HaloError(
            f"derivation {job.label}: its first nvcc object failed: {text.splitlines()[0]}"
        )
    return text, obj
