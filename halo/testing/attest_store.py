"""Where test attestations live: beside the image on this machine, and with it in a registry.

Locally, content-addressed under the store root, keyed by each subject digest:

    attestations/<subject sha256 hex>/<envelope sha256>.dsse.json

(`halo store gc` and `verify` walk only sha256/ and verified/: this folder is not theirs.)

In a registry, as OCI referrers of the image manifest: an OCI image manifest whose ``subject``
is the image's descriptor, artifactType and single layer
``application/vnd.dsse.envelope.v1+json``, config the empty descriptor. Registries without the
referrers API (Debian's docker-registry, distribution 2.8) get the OCI 1.1 fallback as well:
the tag ``sha256-<hex>`` holds an image index of the referrer manifests, read, extended and
written back. Reading asks the API first, then the tag.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from halo.atomic import write_bytes
from halo.errors import HaloError, os_error
from halo.hashing import canonical_json, sha256_bytes
from halo.registry.client import OCI_INDEX, OCI_MANIFEST, Manifest, Registry
from halo.registry.refs import DIGEST, Repo
from halo.testing.attest import ENVELOPE_MEDIA_TYPE, PREDICATE_TYPE, Attestation

EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"


@dataclass(frozen=True)
class LocalAttestations:
    root: Path  # <store root>/attestations

    @classmethod
    def under(cls, store_root: Path) -> LocalAttestations:
        return cls(store_root / "attestations")

    def _folder(self, digest: str) -> Path:
        if not DIGEST.match(digest):
            raise HaloError(f"attestations: refusing subject {digest!r}: expected sha256:<64 hex>")
        return self.root / digest.removeprefix("sha256:")

    def add(self, envelope: bytes, digests: Iterable[str]) -> list[Path]:
        """Keep ``envelope`` under each subject digest (atomically; the same bytes once)."""
        name = f"{sha256_bytes(envelope)}.dsse.json"
        written = []
        for digest in sorted(set(digests)):
            path = self._folder(digest) / name
            if not path.is_file():
                try:
                    write_bytes(path, envelope)
                except OSError as exc:
                    raise os_error(exc, path, "record the attestation") from None
            written.append(path)
        return written

    def for_digest(self, digest: str) -> list[bytes]:
        folder = self._folder(digest)
        if not folder.is_dir():
            return []
        out = []
        for path in sorted(folder.glob("*.dsse.json")):
            try:
                out.append(path.read_bytes())
            except OSError as exc:
                raise os_error(exc, path, "read the attestation") from None
        return out


def fallback_tag(digest: str) -> str:
    """The OCI 1.1 referrers tag schema: ``<alg>-<hex>``."""
    return digest.replace(":", "-", 1)[:128]


def _put_blob(registry: Registry, repo: Repo, data: bytes) -> dict[str, object]:
    digest = f"sha256:{sha256_bytes(data)}"
    if not registry.has_blob(repo, digest):
        registry.upload_blob(repo, digest, len(data), io.BytesIO(data))
    return {"digest": digest, "size": len(data)}


def attach(registry: Registry, repo: Repo, subject: Manifest, atts: Iterable[Attestation]) -> int:
    """Attach each attestation to ``subject`` in ``repo``; returns how many were new there."""
    index = registry.get_manifest(repo, fallback_tag(subject.digest))
    listed = []
    if index is not None and index.media_type == OCI_INDEX:
        listed = list(index.json.get("manifests") or [])
    known = {str(d.get("digest")) for d in listed}
    added = 0
    for att in atts:
        manifest = referrer_manifest(registry, repo, subject, att)
        if manifest.digest in known:
            continue
        registry.put_manifest(repo, manifest.digest, manifest)
        listed.append(
            {
                "mediaType": OCI_MANIFEST,
                "digest": manifest.digest,
                "size": len(manifest.body),
                "artifactType": ENVELOPE_MEDIA_TYPE,
                "annotations": manifest.json.get("annotations", {}),
            }
        )
        known.add(manifest.digest)
        added += 1
    if added:
        body = canonical_json({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": listed})
        registry.put_manifest(repo, fallback_tag(subject.digest), Manifest(body, OCI_INDEX))
    return added


def referrer_manifest(
    registry: Registry, repo: Repo, subject: Manifest, att: Attestation
) -> Manifest:
    """The referrer manifest of one envelope (its blobs uploaded to ``repo`` first)."""
    config = {"mediaType": EMPTY_MEDIA_TYPE, **_put_blob(registry, repo, EMPTY)}
    layer = {"mediaType": ENVELOPE_MEDIA_TYPE, **_put_blob(registry, repo, att.envelope)}
    layer["annotations"] = {"in-toto.io/predicate-type": att.predicate_type or PREDICATE_TYPE}
    notes = {}
    if att.statement is not None:
        notes = {
            "io.halo.test.tier": att.statement.inputs.tier,
            "io.halo.test.result": att.statement.outcome.result,
        }
        if att.statement.outcome.finished_on:
            notes["org.opencontainers.image.created"] = att.statement.outcome.finished_on
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ENVELOPE_MEDIA_TYPE,
        "config": config,
        "layers": [layer],
        "subject": {
            "mediaType": subject.media_type,
            "digest": subject.digest,
            "size": len(subject.body),
        },
        "annotations": notes,
    }
    return Manifest(canonical_json(doc), OCI_MANIFEST)


def referrers(registry: Registry, repo: Repo, digest: str) -> list[bytes]:
    """The DSSE envelopes attached to ``digest`` in ``repo`` (API and fallback tag, merged)."""
    descriptors: dict[str, dict[str, object]] = {}
    for index in (
        registry.referrers(repo, digest, ENVELOPE_MEDIA_TYPE),
        registry.get_manifest(repo, fallback_tag(digest)),
    ):
        if index is None or index.media_type != OCI_INDEX:
            continue
        for d in index.json.get("manifests") or []:
            if isinstance(d, dict) and d.get("artifactType") == ENVELOPE_MEDIA_TYPE:
                descriptors.setdefault(str(d.get("digest")), d)
    out = []
    for ref in sorted(descriptors):
        if not DIGEST.match(ref):
            continue
        manifest = registry.get_manifest(repo, ref)
        if manifest is None:
            continue
        try:
            doc = manifest.json
            if (doc.get("subject") or {}).get("digest") != digest:
                continue  # an index entry that does not refer to this image
            layers = [
                x for x in doc.get("layers") or [] if x.get("mediaType") == ENVELOPE_MEDIA_TYPE
            ]
        except (HaloError, AttributeError, ValueError):
            continue
        out += [registry.blob_bytes(repo, str(x["digest"])) for x in layers if "digest" in x]
    return out


def envelope_json(data: bytes) -> str:
    """An envelope for people: pretty JSON, the payload decoded beside it."""
    import base64

    doc = json.loads(data)
    with contextlib.suppress(ValueError, KeyError, TypeError):
        doc["payload (decoded)"] = json.loads(base64.b64decode(doc["payload"]))
    return json.dumps(doc, indent=2, sort_keys=True)
