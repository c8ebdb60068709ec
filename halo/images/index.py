"""One tag, every platform: an OCI image index over an image's per-platform manifests.

`halo image index NAME --registry R` pushes, by digest, each platform's image built here for
the checkout's inputs (the amd64 one `halo image build NAME` made, the arm64 one
`halo image build NAME --platform linux/arm64` assembled), then PUTs an OCI image index that
names each manifest with its platform. The index is tagged with an immutable
``TAG-<index hash>`` (the hash of the platforms' input hashes: another input on any platform
is another index) and the moving ``TAG``; each platform manifest keeps its own immutable
``TAG-<input hash>``, so a platform is still pulled and checked by itself. An immutable tag is
never moved. Provenance (revision, source) annotates the index and every manifest; each
platform's SBOM is inside its image (/etc/halo/sbom.cdx.json).

`verify_index` is the anonymous check: the moving and immutable tags serve one index, it
names exactly the wanted platforms, and every platform's manifest, config and layers pull,
its config saying that platform and the input hash its manifest's tag names.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from halo.errors import HaloError
from halo.hashing import sha256_json
from halo.images.catalog_types import Image
from halo.images.graph import INPUT_LABEL, Platform, parse_platform
from halo.registry.client import OCI_INDEX, Manifest, Registry
from halo.registry.refs import Repo, repo_under

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Entry:
    platform: Platform
    input_hash: str
    manifest: Manifest


def index_hash(entries: Sequence[Entry]) -> str:
    """The index's address: its platforms' input hashes (not the manifests' digests, which
    carry push-time annotations)."""
    return sha256_json({str(e.platform): e.input_hash for e in entries})


def index_manifest(entries: Sequence[Entry], annotations: dict[str, str]) -> Manifest:
    """An OCI image index, serialised the same way every time; platforms in a fixed order."""
    manifests = []
    for e in sorted(entries, key=lambda e: str(e.platform)):
        platform: dict[str, str] = {"architecture": e.platform.arch, "os": e.platform.os}
        if e.platform.arch == "arm64":
            platform["variant"] = "v8"
        manifests.append(
            {
                "mediaType": e.manifest.media_type,
                "digest": e.manifest.digest,
                "size": len(e.manifest.body),
                "platform": platform,
                "annotations": {INPUT_LABEL: e.input_hash},
            }
        )
    doc: dict[str, object] = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
    if annotations:
        doc["annotations"] = dict(sorted(annotations.items()))
    return Manifest(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode(), OCI_INDEX)


def _tag(registry: Registry, dest: Repo, tag: str, manifest: Manifest, immutable: bool) -> None:
    there = registry.get_manifest(dest, tag)
    if there is not None and there.digest != manifest.digest and immutable:
        raise HaloError(
            f"{dest.ref(tag)}: serves {there.digest[:19]}, not {manifest.digest[:19]}; an "
            "immutable tag is never moved"
        )
    if there is None or there.digest != manifest.digest:
        registry.put_manifest(dest, tag, manifest)


def push_index(
    repo: Path,
    image: Image,
    registry: str,
    platforms: Sequence[Platform],
    progress: Progress,
) -> tuple[str, list[Entry]]:
    """Push each platform's image and the index over them; returns (TAG ref, entries)."""
    from halo.images.catalog import load_catalog
    from halo.images.docker import Docker
    from halo.images.evaluate.plan import evaluate
    from halo.images.provenance import annotations
    from halo.images.realise.build import require_current
    from halo.paths import cache_home, scratch_root
    from halo.registry.transfer import ExportCache, push_local

    if image.stage_of:
        raise HaloError(f"images.{image.name}: a CI stage, never published; index {image.stage_of}")
    catalog = load_catalog(repo)
    docker = Docker.discover()
    docker.ping()
    # Every platform is evaluated and found built before anything is pushed.
    nodes = [evaluate(repo, catalog, image, p).target for p in platforms]
    local = [(node, require_current(docker, node)) for node in nodes]
    dest = repo_under(registry, image.publish)
    reg = Registry(dest.host)
    notes = annotations(repo)
    work = scratch_root() / "export"
    work.mkdir(parents=True, exist_ok=True)
    entries = []
    for node, image_id in local:
        progress(f"{dest}: pushing {node.platform} ({node.immutable_ref}) by digest")
        with tempfile.TemporaryDirectory(dir=work) as tmp:
            manifest, _ = push_local(
                reg, dest, docker.exe, node.immutable_ref, image_id, notes, Path(tmp),
                ExportCache(cache_home() / "exports"), progress,
            )  # fmt: skip
        _tag(reg, dest, f"{image.tag}-{node.hash[:12]}", manifest, immutable=True)
        entries.append(Entry(node.platform, node.hash, manifest))
    index = index_manifest(entries, notes)
    reg.put_manifest(dest, index.digest, index)
    _tag(reg, dest, f"{image.tag}-{index_hash(entries)[:12]}", index, immutable=True)
    _tag(reg, dest, image.tag, index, immutable=False)
    return dest.ref(image.tag), entries


@dataclass(frozen=True)
class PlatformCheck:
    platform: str
    digest: str
    input_hash: str
    blobs: int


def verify_index(image: Image, registry: str, platforms: Sequence[Platform]) -> list[PlatformCheck]:
    """With no credentials: the tags serve one index over exactly ``platforms``, and each
    platform's image pulls whole and is what its entry says."""
    dest = repo_under(registry, image.publish)
    anon = Registry(dest.host, anonymous=True)
    index = anon.get_manifest(dest, image.tag)
    if index is None:
        raise HaloError(f"{dest.ref(image.tag)}: not found by an anonymous pull")
    if index.media_type != OCI_INDEX:
        raise HaloError(f"{dest.ref(image.tag)}: serves {index.media_type}, not an image index")
    listed = index.json.get("manifests", [])
    found = {
        str(parse_platform(f"{m['platform']['os']}/{m['platform']['architecture']}")): m
        for m in listed
    }
    wanted = sorted(str(p) for p in platforms)
    if sorted(found) != wanted or len(listed) != len(wanted):
        raise HaloError(f"{dest.ref(image.tag)}: platforms {sorted(found)}, expected {wanted}")
    checks = []
    for name in wanted:
        desc = found[name]
        want_hash = str(desc.get("annotations", {}).get(INPUT_LABEL, ""))
        manifest = anon.get_manifest(dest, str(desc["digest"]))
        if manifest is None or manifest.digest != desc["digest"]:
            raise HaloError(f"{dest.ref(str(desc['digest']))}: {name} manifest not pullable")
        config = json.loads(anon.blob_bytes(dest, str(manifest.json["config"]["digest"])))
        arch = f"{config.get('os')}/{config.get('architecture')}"
        label = (config.get("config") or {}).get("Labels", {}).get(INPUT_LABEL, "")
        if arch != name or label != want_hash:
            raise HaloError(
                f"{dest.ref(manifest.digest)}: is {arch} with input hash {label[:12] or 'none'}; "
                f"the index says {name} {want_hash[:12]}"
            )
        by_tag = anon.get_manifest(dest, f"{image.tag}-{want_hash[:12]}")
        if by_tag is None or by_tag.digest != manifest.digest:
            raise HaloError(f"{dest.ref(image.tag)}-{want_hash[:12]}: does not serve {name}")
        blobs = manifest.blobs()
        for blob in blobs:
            if not anon.has_blob(dest, str(blob["digest"])):
                raise HaloError(f"{dest.ref(str(blob['digest']))}: blob not pullable anonymously")
        checks.append(PlatformCheck(name, manifest.digest, want_hash, len(blobs)))
    entries = [Entry(parse_platform(c.platform), c.input_hash, index) for c in checks]
    immutable = f"{image.tag}-{index_hash(entries)[:12]}"
    pinned = anon.get_manifest(dest, immutable)
    if pinned is None or pinned.digest != index.digest:
        raise HaloError(f"{dest.ref(immutable)}: does not serve the index {index.digest[:19]}")
    return checks
