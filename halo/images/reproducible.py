"""Same inputs, same image ID: the image config, written without the build's wall clock.

What varies between two builds of the same inputs with Docker 20.10's built-in BuildKit, and
what is done about it (measured by building twice from scratch and comparing layer tars):

- File mtimes in every layer, and stub files/folders BuildKit leaves where it mounts things.
  Each RUN step ends with `halo-normalize` (halo/images/normalize.sh), which gives every file
  the step touched the time SOURCE_DATE_EPOCH; mount targets exist before the step that mounts
  them (made bases carry /dev and empty /etc/hosts, hostname and resolv.conf; the Dockerfile
  makes its own mount points first), so no stub lands in a layer. With that, the layers'
  diff IDs are equal across builds, daemons and machines; ownership is root's already (the
  CLI maps context files to 0:0, RUN steps run as root), and tar order is the file walk's.
- The image config: `created` and every history entry carry the build's time. BuildKit 0.8 has
  no SOURCE_DATE_EPOCH, and the raw config is only reachable through `docker save`, which
  streams every layer (gigabytes for a warm rebuild that changed one). So the config is
  rebuilt here from `docker image inspect` (layers, runtime settings, labels), with one history
  entry per layer at SOURCE_DATE_EPOCH, and loaded with `docker load` as an archive holding
  only that config and a manifest: the engine already has every layer (load skips layers
  whose chain ID it has), so this takes a fraction of a second and the image ID, the sha256
  of these bytes, is known before loading.
- Labels that change without the inputs changing (the git revision, the clone's remote) stay
  out of the image; a registry can carry them as annotations when publishing.

Alternatives measured and not taken: rewriting every layer after the build (`docker save`,
normalise, `docker load`) works with any Dockerfile but costs a full save and load of the
image on every build, warm ones included; BuildKit's `rewrite-timestamp` needs buildx and
BuildKit 0.13, which Debian's engine does not have.
"""

from __future__ import annotations

import datetime
import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path

from halo.hashing import sha256_bytes

# The runtime settings an image config may carry (OCI image-spec "config", plus Docker's
# Healthcheck, Shell and OnBuild), copied from `docker image inspect` when set. Naming them
# keeps the config the same whatever extra, empty fields an engine version reports.
RUNTIME_KEYS = (
    "User",
    "ExposedPorts",
    "Env",
    "Entrypoint",
    "Cmd",
    "Volumes",
    "WorkingDir",
    "Labels",
    "StopSignal",
    "Healthcheck",
    "Shell",
    "OnBuild",
)
# Labels a build may be given that vary with the checkout, not the inputs.
VOLATILE_LABELS = ("org.opencontainers.image.revision", "org.opencontainers.image.source")


def iso(epoch: int) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def canonical(config: dict[str, object]) -> bytes:
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def normalized_config(inspect: dict, epoch: int, history: Sequence[str]) -> tuple[bytes, str]:  # type: ignore[type-arg]
    """(config bytes, image ID) for an image as `docker image inspect` reports it.

    ``history`` describes each layer, oldest first; it must name every layer.
    """
    layers = list(inspect["RootFS"]["Layers"])
    if len(history) != len(layers):
        raise ValueError(f"history names {len(history)} layers, the image has {len(layers)}")
    runtime = {k: inspect["Config"][k] for k in RUNTIME_KEYS if inspect["Config"].get(k)}
    labels = {k: v for k, v in runtime.get("Labels", {}).items() if k not in VOLATILE_LABELS}
    if labels:
        runtime["Labels"] = labels
    else:
        runtime.pop("Labels", None)
    created = iso(epoch)
    config: dict[str, object] = {
        "architecture": inspect["Architecture"],
        "os": inspect["Os"],
        "created": created,
        "config": runtime,
        "rootfs": {"type": "layers", "diff_ids": layers},
        "history": [{"created": created, "created_by": line} for line in history],
    }
    if inspect.get("Variant"):
        config["variant"] = inspect["Variant"]
    data = canonical(config)
    return data, "sha256:" + sha256_bytes(data)


# Dockerfile instructions that give an image a layer under BuildKit (an empty one included).
LAYER_INSTRUCTIONS = ("RUN", "COPY", "ADD", "WORKDIR")


def layer_history(dockerfile: str, n_layers: int, base: str) -> list[str]:
    """One line per layer: the base's layers, then the final stage's layer instructions.

    Falls back to numbered lines when the counts do not fit (a Dockerfile this reader does not
    follow); history is for people, the digest does not depend on its wording being clever.
    """
    logical: list[str] = []
    pending = ""
    for raw in dockerfile.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        logical.append(" ".join((pending + line).split()))
        pending = ""
    stage: list[str] = []
    for line in logical:
        word = line.split(" ", 1)[0].upper()
        if word == "FROM":
            stage = []
        elif word in LAYER_INSTRUCTIONS:
            stage.append(line)
    n_base = n_layers - len(stage)
    if n_base < 0:
        return [f"layer {i + 1} of {n_layers}" for i in range(n_layers)]
    return [f"{base} (layer {i + 1})" for i in range(n_base)] + stage


def docker_archive(
    out: Path,
    config: bytes,
    tags: Sequence[str],
    layers: Sequence[tuple[str, Path | None]],
    epoch: int,
) -> None:
    """A `docker load` archive: the config, a manifest, and the layer tars given a path.

    ``layers`` pairs each diff ID with its tar, or None for a layer the engine already has
    (`docker load` looks a layer up by chain ID before it reads the file).
    """
    config_name = sha256_bytes(config) + ".json"
    names = [diff_id.removeprefix("sha256:") + "/layer.tar" for diff_id, _ in layers]
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": list(tags) or None, "Layers": names}]
    ).encode()
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in ((config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), epoch, 0o644
            tar.addfile(info, io.BytesIO(data))
        for name, (_, path) in zip(names, layers, strict=True):
            if path is None:
                continue
            info = tar.gettarinfo(str(path), arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = (
                epoch,
                0,
                0,
                "",
                "",
                0o644,
            )
            with path.open("rb") as fh:
                tar.addfile(info, fh)
