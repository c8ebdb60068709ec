"""Build one source tree into one wheel in Docker: images/builder/Dockerfile, ``--network none``.

The context holds exactly what the build may use: ``src/`` (the verified, patched tree),
``wheels/`` and ``install/`` (the toolchain's locked wheels and the images' install step,
which also assembles CUDA_HOME when nvcc is among them), and ``env/`` (the derivation's
environment and the git/curl/wget guard of the native builder). Only ``/out`` comes back.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from halo.builder.native import write_guard
from halo.builder.toolchain import Toolchain, stage_wheels
from halo.errors import HaloError
from halo.images.docker import Docker
from halo.stack.stage import stage_install_step
from halo.store.store import Store

DOCKERFILE = Path("images/builder/Dockerfile")
REFUSED_LOG = "/tmp/halo-refused.log"  # inside the build container


def _sh_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def stage_context(
    ctx: Path,
    tc: Toolchain,
    src: Path,
    env: Mapping[str, str],
    store: Store,
    patches_dir: Path,
) -> None:
    shutil.copytree(src, ctx / "src", symlinks=True)
    stage_wheels(ctx / "wheels", tc.requirements, store)
    stage_install_step(ctx / "install", patches_dir)
    (ctx / "env").mkdir()
    (ctx / "env" / "build.env").write_text(
        "".join(f"{k}={_sh_quote(v)}\n" for k, v in sorted(env.items()))
    )
    write_guard(ctx / "env" / "guard", Path(REFUSED_LOG))


def build_wheel(
    tc: Toolchain,
    src: Path,
    subdirectory: str,
    env: Mapping[str, str],
    parallel: Mapping[str, str],
    work: Path,
    repo: Path,
    docker: Docker,
    store: Store,
    label: str,
) -> Path:
    ctx, out = work / "ctx", work / "out"
    stage_context(ctx, tc, src, env, store, repo / "patches")
    docker.build(
        context=ctx,
        dockerfile=repo / DOCKERFILE,
        tags=[],
        build_args={
            "BUILDER": tc.base_ref,
            "PYTHON": tc.python,
            "SUBDIR": subdirectory or ".",
            **parallel,
        },
        labels={},
        network="none",
        output=out,
    )
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        raise HaloError(
            f"derivation {label}: expected one wheel from the build, got {[w.name for w in wheels]}"
        )
    return wheels[0]
