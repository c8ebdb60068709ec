"""Moving images by digest: a local image out of docker into a registry, and registry to registry.

`docker push` needs a tag and compresses as it likes; here a local image is read from
`docker save` (the config exactly as docker holds it, so the image ID is kept), each layer
is gzip-compressed deterministically (no timestamp or name in the header; ISA-L's deflate at
level 1), checked against the config's diff_ids, and uploaded; the manifest is then PUT by its digest. No tag is
involved: tags are set afterwards, by `halo.images.publish`, on a digest already there.

What was exported for an image ID is remembered (manifest and config, in the cache), so
pushing the same image again, once its blobs are at the destination, reads nothing from
docker.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from halo.atomic import write_bytes
from halo.errors import HaloError
from halo.registry.client import OCI_MANIFEST, Manifest, Registry, sha256_digest
from halo.registry.refs import Repo

OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
# ISA-L's deflate at level 1 (isal, a toolchain dependency): measured on a tar of CPython's
# library, 321 MB/s of CPU against zlib's 51 at level 1, the same size to 1 %. A GPU image's
# stack layer is tens of GB, so this is the stage's largest cost. The bytes are the same on
# every x86-64 with SSE4.2 (igzip's one dispatch point); the registry stores what we send, and
# an image is known by its config's digest, the image ID, which compression does not touch.
GZIP_LEVEL = 1
_CHUNK = 1 << 20
_SMALL = 1 << 20  # members this small stay in memory (configs, metadata)


@dataclass(frozen=True)
class Layer:
    diff_id: str
    digest: str
    size: int
    path: Path | None  # None: the compressed blob is already at the destination


@dataclass(frozen=True)
class LocalImage:
    config: bytes
    layers: tuple[Layer, ...]

    @property
    def image_id(self) -> str:
        return sha256_digest(self.config)


def manifest_for(
    config: bytes, layers: list[tuple[str, int]], annotations: dict[str, str]
) -> Manifest:
    """An OCI image manifest, serialised the same way every time (sorted keys, no spaces)."""
    doc: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": sha256_digest(config), "size": len(config)},
        "layers": [{"mediaType": OCI_LAYER_GZIP, "digest": d, "size": s} for d, s in layers],
    }
    if annotations:
        doc["annotations"] = dict(sorted(annotations.items()))
    return Manifest(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode(), OCI_MANIFEST)


class _Hashing:
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def _compress(src: IO[bytes], dest: Path) -> tuple[str, str, int]:
    """gzip ``src`` into ``dest``; returns (diff_id, digest, size)."""
    try:  # here, not at the top: promote copies blobs and needs no compressor
        from isal import igzip
    except ImportError:
        raise HaloError(
            "compressing a layer needs isal, of halo's toolchain extra "
            "(pip install 'halo-posttrain[toolchain]')"
        ) from None
    raw = hashlib.sha256()
    with dest.open("wb") as fh:
        sink = _Hashing(fh)
        with igzip.GzipFile(
            filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=sink, mtime=0
        ) as gz:  # type: ignore[arg-type]
            # ISA-L's output depends on how its input is cut (zlib's does not): always whole
            # _CHUNKs, however the source reads (a pipe returns what it has).
            pending = bytearray()
            while chunk := src.read(_CHUNK):
                raw.update(chunk)
                pending += chunk
                while len(pending) >= _CHUNK:
                    gz.write(bytes(pending[:_CHUNK]))
                    del pending[:_CHUNK]
            gz.write(bytes(pending))
    return "sha256:" + raw.hexdigest(), "sha256:" + sink.sha.hexdigest(), sink.size


def _read_raw(src: IO[bytes], dest: Path) -> str:
    sha = hashlib.sha256()
    with dest.open("wb") as fh:
        while chunk := src.read(_CHUNK):
            sha.update(chunk)
            fh.write(chunk)
    return "sha256:" + sha.hexdigest()


Reuse = Callable[[str], tuple[str, int] | None]


def export_image(
    docker_exe: str, ref: str, workdir: Path, progress: Callable[[str], None], reuse: Reuse
) -> LocalImage:
    """Stream `docker save REF`; compress each layer into ``workdir`` unless ``reuse`` knows it.

    ``reuse(diff_id)`` names a compressed blob (digest, size) already at the destination;
    hashing a layer is ten times faster than compressing it, so a layer another image
    already published (the base, a cached stack) costs only its read.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    small: dict[str, bytes] = {}
    big: dict[str, Layer] = {}
    links: dict[str, str] = {}

    proc = subprocess.Popen(
        [docker_exe, "save", ref], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                if member.issym():  # a layer saved once already (same diff ID): a link to it
                    links[member.name] = posixpath.normpath(
                        posixpath.join(posixpath.dirname(member.name), member.linkname)
                    )
                    continue
                if not member.isfile():
                    continue
                src = tar.extractfile(member)
                assert src is not None
                if member.size <= _SMALL and not member.name.endswith("layer.tar"):
                    small[member.name] = src.read()
                    continue
                raw = workdir / f"raw-{len(big)}.tar"
                big[member.name] = _layer(src, raw, reuse, progress, member.size)
        # tar pads its end with zero records tarfile never reads: drain them, or docker
        # dies of SIGPIPE writing into a closed pipe.
        while proc.stdout.read(_CHUNK):
            pass
    except BaseException as exc:
        proc.kill()
        proc.wait()
        if isinstance(exc, tarfile.TarError):
            raise HaloError(f"docker save {ref}: unreadable archive ({exc})") from None
        raise
    finally:
        proc.stdout.close()
    err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
    if proc.wait() != 0:
        raise HaloError(
            f"docker save {ref}: failed: {err.splitlines()[-1] if err else proc.returncode}"
        )
    try:
        entry = json.loads(small["manifest.json"])[0]
        config = small[entry["Config"]]
        names = list(entry["Layers"])
    except (KeyError, IndexError, ValueError, TypeError):
        raise HaloError(
            f"docker save {ref}: no manifest.json naming a config and its layers"
        ) from None
    names = [links.get(n, n) for n in names]
    for name in names:  # tiny layers (an empty WORKDIR, a small COPY) were kept in memory
        if name not in big and name in small:
            raw = workdir / f"raw-{len(big)}.tar"
            big[name] = _layer(io.BytesIO(small[name]), raw, reuse, progress, len(small[name]))
    diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    layers = tuple(big[n] for n in names)
    if [layer.diff_id for layer in layers] != diff_ids:
        raise HaloError(f"docker save {ref}: its layers do not match the image's diff_ids")
    return LocalImage(config, layers)


def _layer(
    src: IO[bytes], raw: Path, reuse: Reuse, progress: Callable[[str], None], size: int
) -> Layer:
    diff_id = _read_raw(src, raw)
    try:
        if known := reuse(diff_id):
            return Layer(diff_id, known[0], known[1], None)
        progress(f"compressing layer {diff_id[:19]} ({size / 2**20:,.0f} MiB)")
        gz = raw.with_suffix(".tar.gz")
        with raw.open("rb") as fh:
            _, digest, gz_size = _compress(fh, gz)
        return Layer(diff_id, digest, gz_size, gz)
    finally:
        raw.unlink(missing_ok=True)


@dataclass(frozen=True)
class ExportCache:
    """What earlier pushes compressed: image ID → manifest parts, diff_id → compressed blob.

    Hints only: a blob named here is used only where the destination has it, and the
    registry checks every digest it stores.
    """

    root: Path

    def _path(self, kind: str, digest: str) -> Path:
        return self.root / kind / f"{digest.removeprefix('sha256:')}.json"

    def get(self, image_id: str) -> tuple[bytes, list[tuple[str, int]], str] | None:
        """(config, compressed layers, the repository they went to) of an image pushed before."""
        try:
            data = json.loads(self._path("images", image_id).read_text())
            config = bytes.fromhex(data["config"])
            layers = [(str(d), int(s)) for d, s in data["layers"]]
            where = str(data["repo"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return (config, layers, where) if sha256_digest(config) == image_id else None

    def layer(self, diff_id: str) -> tuple[str, int, str] | None:
        """(digest, size, the repository it was pushed to) of a layer compressed before."""
        try:
            digest, size, where = json.loads(self._path("layers", diff_id).read_text())
            return str(digest), int(size), str(where)
        except (OSError, ValueError, TypeError):
            return None

    def put(self, image: LocalImage, repo: Repo) -> None:
        data = {
            "config": image.config.hex(),
            "layers": [[x.digest, x.size] for x in image.layers],
            "repo": str(repo),
        }
        write_bytes(self._path("images", image.image_id), json.dumps(data).encode())
        for x in image.layers:
            entry = [x.digest, x.size, str(repo)]
            write_bytes(self._path("layers", x.diff_id), json.dumps(entry).encode())


def _at(registry: Registry, repo: Repo, digest: str, where: str) -> bool:
    """Is the blob in ``repo``, or could it be mounted there from ``where`` (same registry)?"""
    if registry.has_blob(repo, digest):
        return True
    host, _, path = where.partition("/")
    source = Repo(host, path)
    return (
        host == repo.host
        and source != repo
        and registry.has_blob(source, digest)
        and registry.mount_blob(repo, digest, source) is None
    )


def push_local(
    registry: Registry,
    repo: Repo,
    docker_exe: str,
    ref: str,
    image_id: str,
    annotations: dict[str, str],
    workdir: Path,
    cache: ExportCache,
    progress: Callable[[str], None],
) -> tuple[Manifest, int]:
    """Push the local image ``ref`` (whose ID is ``image_id``) by digest; no tag is touched.

    Returns the manifest stored and how many blobs had to be uploaded.
    """
    known = cache.get(image_id)
    if known and all(_at(registry, repo, d, known[2]) for d, _ in known[1]):
        config, layers, _ = known
        uploaded = 0
    else:

        def reuse(diff_id: str) -> tuple[str, int] | None:
            """A layer compressed before, present here or mountable from where it went."""
            hit = cache.layer(diff_id)
            if hit is None:
                return None
            digest, size, where = hit
            return (digest, size) if _at(registry, repo, digest, where) else None

        image = export_image(docker_exe, ref, workdir, progress, reuse)
        if image.image_id != image_id:
            raise HaloError(
                f"{ref}: changed while it was exported ({image.image_id[:19]}, not {image_id[:19]})"
            )
        uploaded = 0
        for layer in image.layers:
            if layer.path is not None and not registry.has_blob(repo, layer.digest):
                progress(f"uploading {layer.digest[:19]} ({layer.size / 2**20:,.0f} MiB) to {repo}")
                with layer.path.open("rb") as fh:
                    registry.upload_blob(repo, layer.digest, layer.size, fh)
                uploaded += 1
        cache.put(image, repo)
        config, layers = image.config, [(x.digest, x.size) for x in image.layers]
    config_digest = sha256_digest(config)
    if not registry.has_blob(repo, config_digest):
        registry.upload_blob(repo, config_digest, len(config), io.BytesIO(config))
        uploaded += 1
    manifest = manifest_for(config, layers, annotations)
    registry.put_manifest(repo, manifest.digest, manifest)
    return manifest, uploaded


def copy_image(
    src: Registry,
    src_repo: Repo,
    dst: Registry,
    dst_repo: Repo,
    manifest: Manifest,
    progress: Callable[[str], None],
) -> int:
    """Make ``manifest`` and its blobs exist in ``dst_repo`` under its digest; returns blobs moved."""
    moved = 0
    for desc in manifest.blobs():
        digest, size = str(desc["digest"]), int(desc["size"])
        if dst.has_blob(dst_repo, digest):
            continue
        location = None
        if src.host == dst.host:
            location = dst.mount_blob(dst_repo, digest, src_repo)
            if location is None:
                moved += 1
                continue
        progress(f"copying {digest[:19]} ({size / 2**20:,.0f} MiB) {src_repo} → {dst_repo}")
        with src.open_blob(src_repo, digest) as resp:
            dst.upload_blob(dst_repo, digest, size, resp, location)
        moved += 1
    dst.put_manifest(dst_repo, manifest.digest, manifest)
    return moved
