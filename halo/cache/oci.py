"""Derivation outputs as OCI artifacts on a registry: compiled once, pulled by every host.

One entry per derivation, tagged ``drv-<derivation hash>`` in ``<registry>/halo-derivations``
(the registry the images go to), through the OCI distribution API (halo.registry):

    manifest  OCI image manifest, artifactType application/vnd.halo.derivation.v1
    config    the derivation record (JSON): its inputs, the wheel's name and sha256
    layers    the wheel (its digest *is* the recorded sha256), and the record's SSH signature
              when the pusher signs

Pulling checks, before anything lands in the store: the record parses, names this
derivation and its inputs hash to it; a signature or a pinned digest vouches for its output
hash (halo.cache.trust); the wheel layer's digest is that hash, and its bytes hash to it as
they stream into the store. Anything else is refused with one line, and nothing is kept.
Entries are never overwritten: the first push of a derivation is the one every host uses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from halo.builder.record import DerivationRecord, parse_record
from halo.cache.trust import Trust, sign
from halo.errors import HaloError
from halo.hashing import CHUNK
from halo.report import Progress, say
from halo.store.store import Store

ARTIFACT_TYPE = "application/vnd.halo.derivation.v1"
RECORD_TYPE = "application/vnd.halo.derivation.record.v1+json"
WHEEL_TYPE = "application/vnd.halo.wheel.v1+zip"
SIGNATURE_TYPE = "application/vnd.halo.derivation.signature.v1"
TITLE = "org.opencontainers.image.title"
TAG_PREFIX = "drv-"


def tag(drv_hash: str) -> str:
    return f"{TAG_PREFIX}{drv_hash}"


@dataclass(frozen=True)
class Pushed:
    name: str
    drv_hash: str
    state: str  # "pushed" | "already there"
    wheel_sha256: str


REPOSITORY = "halo-derivations"  # the cache's repository, under the registry's prefix


class RegistryCache:
    """The binary cache on one registry repository."""

    def __init__(self, registry: str, trust: Trust, signing_key: Path | None = None) -> None:
        from halo.registry.client import Registry
        from halo.registry.refs import repo_under

        self.repo = repo_under(registry, REPOSITORY)
        self.client = Registry(self.repo.host)
        self.trust = trust
        self.signing_key = signing_key

    def where(self, drv_hash: str) -> str:
        return self.repo.ref(tag(drv_hash))

    def _manifest(self, drv_hash: str) -> dict[str, Any] | None:
        found = self.client.get_manifest(self.repo, tag(drv_hash))
        return None if found is None else found.json

    def has(self, drv_hash: str) -> bool:
        return self._manifest(drv_hash) is not None

    # -- pull ----------------------------------------------------------------------------------

    def pull(self, drv_hash: str, store: Store) -> DerivationRecord | None:
        """The entry's record with its wheel added to ``store``; None when there is no entry."""
        doc = self._manifest(drv_hash)
        if doc is None:
            return None
        where = self.where(drv_hash)
        config = doc.get("config") or {}
        if config.get("mediaType") != RECORD_TYPE:
            raise HaloError(f"{where}: refused: not a halo derivation entry")
        record_bytes = self.client.blob_bytes(self.repo, str(config.get("digest")))
        try:
            record = parse_record(record_bytes.decode(), where)
        except (HaloError, UnicodeDecodeError) as exc:
            raise HaloError(f"{where}: refused: its record is unusable ({exc})") from None
        if record.hash != drv_hash:
            raise HaloError(f"{where}: refused: its record is for derivation {record.hash[:12]}")
        layers = doc.get("layers") or []
        wheels = [x for x in layers if x.get("mediaType") == WHEEL_TYPE]
        signatures = [x for x in layers if x.get("mediaType") == SIGNATURE_TYPE]
        signature = (
            self.client.blob_bytes(self.repo, str(signatures[0].get("digest")))
            if signatures
            else None
        )
        if (
            why := self.trust.why_not(drv_hash, record.sha256, record_bytes, signature)
        ) is not None:
            raise HaloError(f"{where}: refused: not trusted: {why}")
        if len(wheels) != 1 or wheels[0].get("digest") != f"sha256:{record.sha256}":
            raise HaloError(
                f"{where}: refused: its wheel layer is not the recorded sha256 {record.sha256[:12]}"
            )
        if not store.has(record.sha256):
            self._download(record, int(wheels[0].get("size") or 0), store, where)
        say(f"cache: {record.name} {drv_hash[:12]}: pulled {record.wheel} (sha256 verified)")
        return record

    def _download(self, record: DerivationRecord, size: int, store: Store, where: str) -> None:
        progress = Progress(record.wheel, size or None)
        resp = self.client.open_blob(self.repo, f"sha256:{record.sha256}")
        with resp:
            chunks = iter(lambda: resp.read(CHUNK), b"")
            try:
                store.add_stream(record.sha256, chunks, record.wheel, progress.advance)
            except HaloError as exc:
                raise HaloError(f"{where}: refused: {exc.message}") from None
        progress.finish()

    # -- push ----------------------------------------------------------------------------------

    def push(self, record: DerivationRecord, store: Store) -> Pushed:
        """Publish a realised derivation (its record and wheel from ``store``), unless it is there."""
        from halo.registry.client import OCI_MANIFEST, Manifest, sha256_digest

        if self.has(record.hash):
            return Pushed(record.name, record.hash, "already there", record.sha256)
        wheel = store.verify(record.sha256, record.wheel)
        record_bytes = record.to_json().encode()
        blobs: list[tuple[str, bytes | Path, dict[str, str]]] = [
            (WHEEL_TYPE, wheel, {TITLE: record.wheel}),
        ]
        if self.signing_key is not None:
            blobs.append((SIGNATURE_TYPE, sign(record_bytes, self.signing_key), {}))
        layers = []
        for media, data, notes in blobs:
            digest, size = self._upload(data, record.sha256 if isinstance(data, Path) else None)
            entry: dict[str, Any] = {"mediaType": media, "digest": digest, "size": size}
            if notes:
                entry["annotations"] = notes
            layers.append(entry)
        config_digest, config_size = self._upload(record_bytes)
        doc = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": ARTIFACT_TYPE,
            "config": {"mediaType": RECORD_TYPE, "digest": config_digest, "size": config_size},
            "layers": layers,
            "annotations": {"io.halo.derivation": record.hash, "io.halo.name": record.name},
        }
        body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        manifest = Manifest(body, OCI_MANIFEST)
        assert manifest.digest == sha256_digest(body)
        self.client.put_manifest(self.repo, tag(record.hash), manifest)
        return Pushed(record.name, record.hash, "pushed", record.sha256)

    def _upload(self, data: bytes | Path, sha256: str | None = None) -> tuple[str, int]:
        import io

        from halo.registry.client import sha256_digest

        if isinstance(data, Path):
            digest, size = f"sha256:{sha256}", data.stat().st_size
            if not self.client.has_blob(self.repo, digest):
                with data.open("rb") as fh:
                    self.client.upload_blob(self.repo, digest, size, fh)
            return digest, size
        digest = sha256_digest(data)
        if not self.client.has_blob(self.repo, digest):
            self.client.upload_blob(self.repo, digest, len(data), io.BytesIO(data))
        return digest, len(data)
