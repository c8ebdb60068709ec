"""Stage a build context: exactly the bytes the Dockerfile may use, nothing from the network.

wheels/    the lock's artifacts, hard-linked from the store after re-verifying their sha256,
           plus requirements.txt (name==version --hash=...) and _pip.whl to install them
install/   the install step that installs them (halo.stack.stage; `halo stack verify` runs
           the same one)
kernels/   wheels of source derivations (may be empty) and their requirements.txt
halo/      halo's own wheel, build-inputs.json and the image's SBOM (halo.images.sbom)
patches/   the patch modules, applied strictly in the image
image/     the files next to the image's Dockerfile (a server's entrypoint script)
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from halo.hashing import sha256_file
from halo.images.sbom import SBOM_FILE, image_sbom
from halo.images.wheel import build_wheel
from halo.pins.lockfile import Lock
from halo.stack.stage import stage
from halo.store.store import Store


def stage_context(
    ctx: Path,
    repo: Path,
    lock: Lock,
    store: Store,
    kernel_wheels: Sequence[tuple[Path, str]],
    build_inputs: dict[str, object],
    image_dir: Path | None = None,
) -> None:
    """Fill ``ctx`` (an empty directory). Raises before writing the Dockerfile if any artifact is off."""
    stage(ctx, lock, store, repo / "patches")

    kernels = ctx / "kernels"
    kernels.mkdir()
    kernel_lines = []
    for wheel, sha in kernel_wheels:
        shutil.copyfile(wheel, kernels / wheel.name)
        kernel_lines.append(
            f"{wheel.name.split('-')[0]} @ file:///tmp/halo-kernels/{wheel.name} --hash=sha256:{sha}"
        )
    (kernels / "requirements.txt").write_text("".join(f"{line}\n" for line in kernel_lines))

    dist = ctx / "halo"
    wheel = build_wheel(repo, dist)
    (dist / "build-inputs.json").write_text(
        json.dumps(build_inputs, indent=2, sort_keys=True) + "\n"
    )
    wheels = [(w.name, sha) for w, sha in kernel_wheels] + [(wheel.name, sha256_file(wheel))]
    ref, input_hash = str(build_inputs["image_ref"]), str(build_inputs["input_hash"])
    (dist / SBOM_FILE).write_text(image_sbom(lock, ref, input_hash, wheels))
    shutil.copytree(
        repo / "patches", ctx / "patches", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    # The Dockerfile itself is passed with -f; what sits next to it is what it may COPY.
    own = ctx / "image"
    own.mkdir()
    if image_dir is not None:
        for path in sorted(image_dir.iterdir()):
            if path.is_file() and path.name != "Dockerfile":
                shutil.copy2(path, own / path.name)
