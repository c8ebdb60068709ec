"""Publishing: build once, stage by digest, test that digest, promote that digest.

- `stage`: the image built here for the checkout's inputs (its input hash recomputed, not
  read back from a tag) is pushed by digest to a staging repository. The result is a
  reference pinned by digest (``HOST/…/halo@sha256:…``) that test jobs pull and run.
- `promote`: a staged digest becomes the release: pushed by digest to the release
  repository (blobs mounted or copied, the manifest PUT by digest), then tagged with the
  immutable ``TAG-<input hash>`` and the moving ``TAG`` by PUTting the same manifest bytes
  under each tag. Nothing is rebuilt; both tags serve one digest.
- `push` = stage into the release repository itself, then promote: for a person publishing
  from a workstation (`make push-public-cpu`).
- `verify_public`: with no credentials at all, both tags resolve to one digest whose
  manifest and blobs can be pulled.

Promote publishes only what was tested (halo.testing.attest_gate): for every tier in the
catalog entry's `gate`, a passing test attestation of the staged digest (or its config digest)
signed by a key in HALO_TRUSTED_KEYS, for the checkout's tests. They are found attached to the
staged digest in the staging registry (OCI referrers) and beside the image here; the ones that
passed are attached to the released digest too. `--override-tests "WHO: WHY"` promotes without
them, and records that in a signed WARNED attestation attached to the released digest.

"Same image" is decided by input hash and content, never by image ID or a label nobody
recomputed. The staged digest pins its config, so its input-hash label is the one the build
job computed. An immutable tag already there is accepted only if it serves that digest, or an
image with the same input hash and the same content (layer diff_ids and runtime config; only
the creation time and provenance may differ): a rebuild from identical inputs is "already
published" and the moving tag follows the immutable one. Anything else under that tag (a
forged label, other content) is refused: an immutable tag is never moved.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from halo.errors import HaloError
from halo.hashing import sha256_json
from halo.images.catalog import Image
from halo.registry.client import Manifest, Registry
from halo.registry.refs import Ref, Repo, parse_ref, repo_under

INPUT_LABEL = "io.halo.input-hash"
# Labels that describe a build or a push rather than the image: ignored when comparing content.
VOLATILE_LABELS = frozenset(
    {
        "org.opencontainers.image.created",
        "org.opencontainers.image.revision",
        "org.opencontainers.image.source",
    }
)
_HASH = re.compile(r"^[0-9a-f]{64}$")

Progress = Callable[[str], None]


def registry_from(arg: str | None, env: str = "HALO_REGISTRY", flag: str = "--registry") -> str:
    registry = (arg or os.environ.get(env, "")).strip().rstrip("/")
    if not registry:
        raise HaloError(f"halo image: no registry; pass {flag} HOST[/ALIAS] or set {env}")
    return registry


@dataclass(frozen=True)
class Facts:
    """What an image config says about itself, reduced to what decides "same image"."""

    input_hash: str
    runtime: str  # entrypoint, env, user, labels…: everything but the files and build times
    diff_ids: tuple[str, ...]

    @classmethod
    def of(cls, config: bytes, where: str) -> Facts:
        try:
            doc = json.loads(config)
            labels = dict((doc.get("config") or {}).get("Labels") or {})
            diff_ids = tuple(str(d) for d in (doc.get("rootfs") or {}).get("diff_ids") or ())
        except (ValueError, AttributeError, TypeError):
            raise HaloError(f"{where}: its image config is not an image config") from None
        input_hash = str(labels.get(INPUT_LABEL, ""))
        if not _HASH.match(input_hash):
            raise HaloError(
                f"{where}: has no {INPUT_LABEL} label; only images built by halo are published"
            )
        return cls(input_hash, runtime_identity(doc), diff_ids)


def runtime_identity(config: dict[str, Any]) -> str:
    """The hash of how a container of this image runs: entrypoint, env, user, labels…

    Creation time, history and provenance labels are left out; the files are compared
    separately (by diff_id, or by fingerprint where the layers' timestamps differ).
    """
    runtime = {k: v for k, v in (config.get("config") or {}).items() if v not in (None, "", [], {})}
    labels = {
        k: v for k, v in (runtime.pop("Labels", None) or {}).items() if k not in VOLATILE_LABELS
    }
    return sha256_json(
        {
            "architecture": config.get("architecture"),
            "os": config.get("os"),
            "variant": config.get("variant"),
            "runtime": runtime,
            "labels": labels,
        }
    )


def same_image(
    ours: Facts,
    theirs: Facts,
    fingerprints: Callable[[int], tuple[str, str]],
    progress: Progress,
) -> str | None:
    """None when both are the same image; else why not (one phrase).

    ``fingerprints(i)`` gives layer i's file fingerprints (ours, theirs); it is asked only
    for layers whose diff_ids differ, which happens when a build is not reproducible.
    """
    if theirs.input_hash != ours.input_hash:
        return f"input hash {theirs.input_hash[:12]}"
    if theirs.runtime != ours.runtime:
        return "another runtime config under the same input-hash label"
    if len(theirs.diff_ids) != len(ours.diff_ids):
        return "other layers under the same input-hash label"
    for i, (a, b) in enumerate(zip(ours.diff_ids, theirs.diff_ids, strict=True)):
        if a == b:
            continue
        progress(f"layer {i}: diff_ids differ ({a[:19]}, {b[:19]}); comparing the files")
        mine, other = fingerprints(i)
        if mine != other:
            return f"other files in layer {i} under the same input-hash label"
    return None


@dataclass(frozen=True)
class Published:
    image: Image
    immutable: str
    moving: str
    digest: str
    state: str  # "published" | "already published"
    moving_updated: bool


def _config(registry: Registry, repo: Repo, manifest: Manifest) -> bytes:
    return registry.blob_bytes(repo, str(manifest.blobs()[0]["digest"]))


@dataclass(frozen=True)
class Override:
    """Who promotes a digest without its required test results, and why."""

    who: str
    why: str

    @classmethod
    def parse(cls, text: str) -> Override:
        who, sep, why = text.partition(":")
        if not sep or not who.strip() or not why.strip():
            raise HaloError(
                f'--override-tests {text!r}: expected "WHO: WHY" (who overrides, and why)'
            )
        return cls(who.strip(), why.strip())


@dataclass(frozen=True)
class Evidence:
    """What the gate found: the attestations it accepted, and override records to attach."""

    accepted: tuple[Any, ...]
    overrides: tuple[Any, ...] = ()
    lines: tuple[str, ...] = ()


def _evidence(
    repo: Path,
    image: Image,
    source: str,
    src_reg: Registry,
    src: Ref,
    manifest: Manifest,
    override: Override | None,
    progress: Progress,
) -> Evidence:
    """The gate: every tier in ``image.gate`` passed on this digest (one line when not)."""
    from halo.testing.attest import Keys, checkout_tests_hash
    from halo.testing.attest_gate import gate
    from halo.testing.attest_run import local_store
    from halo.testing.attest_store import referrers

    if not image.gate:
        raise HaloError(
            f"images.{image.name}: no `gate` in images/images.yaml; promote publishes only what "
            "passed the tiers the catalog requires"
        )
    keys = Keys.from_env()
    config_digest = str(manifest.blobs()[0]["digest"])
    digests = {manifest.digest, config_digest}
    store = local_store()
    envelopes = referrers(src_reg, src.repo, manifest.digest)
    for digest in sorted(digests):
        envelopes += store.for_digest(digest)
    tests = checkout_tests_hash(repo)
    verdicts = gate(image.gate, envelopes, keys.trusted, digests, tests)
    accepted = tuple(v.accepted for v in verdicts if v.accepted is not None)
    lines = tuple(
        f"tier {v.tier}: passed at {v.accepted.statement.outcome.finished_on}, signed by trusted "
        f"key {v.accepted.keyids[0][:12]}"
        for v in verdicts
        if v.accepted is not None and v.accepted.statement is not None
    )
    missing = [v for v in verdicts if v.accepted is None]
    if not missing:
        return Evidence(accepted, (), lines)
    tiers = ", ".join(v.tier for v in missing)
    if override is None:
        trust = "" if keys.trusted else "no trusted keys (set HALO_TRUSTED_KEYS); "
        raise HaloError(
            f"{source}: not promoted: no valid passing attestation for tier {tiers}: {trust}"
            + "; ".join(v.line() for v in missing)
            + f"; run `halo test {missing[0].tier.replace('_', '-')} --image {source}` with "
            'HALO_ATTEST_KEY set, or pass --override-tests "WHO: WHY"'
        )
    if keys.signer is None:
        raise HaloError(
            "--override-tests: the override is recorded in a signed attestation; set "
            "HALO_ATTEST_KEY to an ed25519 private key (halo attest keygen PATH)"
        )
    records = _override_records(keys, src, manifest, [v.tier for v in missing], tests, override)
    for att in records:
        store.add(att.envelope, digests)
    progress(
        f"warning: {manifest.digest[:19]} promoted without a passing {tiers} attestation: "
        f"overridden by {override.who}: {override.why} (recorded, signed by key {keys.keyid[:12]})"
    )
    return Evidence(accepted, tuple(records), lines)


def _override_records(  # type: ignore[no-untyped-def]
    keys, src: Ref, manifest: Manifest, tiers: list[str], tests: str, override: Override
) -> list[Any]:
    from halo.testing.attest import (
        WARNED,
        Outcome,
        ResultStatement,
        RunInputs,
        Subject,
        ci_run_url,
        envelope,
        read,
        subjects_named,
    )
    from halo.testing.attest_run import now_utc

    config_digest = str(manifest.blobs()[0]["digest"])
    subjects: tuple[Subject, ...] = subjects_named(
        str(src.repo), config_digest, (manifest.digest, manifest.media_type)
    )
    outcome = Outcome(
        WARNED, finished_on=now_utc(), url=ci_run_url(), override=(override.who, override.why)
    )
    return [
        read(
            envelope(ResultStatement(subjects, RunInputs(tier, tests=tests), outcome), keys.signer)
        )
        for tier in tiers
    ]


def check_gate(repo: Path, image: Image, source: str) -> list[str]:
    """`halo attest verify`: the gate alone, nothing pushed; a line per tier (raises if refused)."""
    src_reg, src, manifest = _staged(source)
    Facts.of(_config(src_reg, src.repo, manifest), source)
    return list(_evidence(repo, image, source, src_reg, src, manifest, None, lambda _: None).lines)


def _staged(ref: str) -> tuple[Registry, Ref, Manifest]:
    src = parse_ref(ref)
    if not src.digest:
        raise HaloError(
            f"{ref}: promote takes a reference pinned by digest (REPO@sha256:…), not a tag"
        )
    registry = Registry(src.repo.host)
    manifest = registry.get_manifest(src.repo, src.digest)
    if manifest is None:
        raise HaloError(f"{ref}: not found in the staging registry")
    return registry, src, manifest


def promote(
    image: Image,
    source: str,
    registry: str,
    progress: Progress,
    override: Override | None = None,
    repo: Path | None = None,
) -> Published:
    """Publish the staged digest ``source`` under ``registry``'s moving and immutable tags,
    if the gate lets it (see the module's docstring)."""
    from halo.paths import find_repo

    src_reg, src, manifest = _staged(source)
    ours = Facts.of(_config(src_reg, src.repo, manifest), source)
    dest = repo_under(registry, image.publish)  # a bad registry is refused before the gate
    evidence = _evidence(
        repo or find_repo(), image, source, src_reg, src, manifest, override, progress
    )
    for line in evidence.lines:
        progress(line)
    dst_reg = src_reg if dest.host == src.repo.host else Registry(dest.host)
    immutable_tag = f"{image.tag}-{ours.input_hash[:12]}"
    there = dst_reg.get_manifest(dest, immutable_tag)
    if there is None:
        moved = copy_if_needed(src_reg, src.repo, dst_reg, dest, manifest, progress)
        progress(f"{dest}: {manifest.digest[:19]} pushed by digest ({moved} blobs moved); tagging")
        dst_reg.put_manifest(dest, immutable_tag, manifest)
        target, state = manifest, "published"
    elif there.digest == manifest.digest:
        target, state = there, "already published"
    else:
        theirs = Facts.of(_config(dst_reg, dest, there), dest.ref(immutable_tag))

        def fingerprints(i: int) -> tuple[str, str]:
            return (
                _fingerprint(src_reg, src.repo, manifest, i),
                _fingerprint(dst_reg, dest, there, i),
            )

        why = same_image(ours, theirs, fingerprints, progress)
        if why is not None:
            raise HaloError(
                f"{dest.ref(immutable_tag)}: holds {there.digest[:19]} ({why}), not "
                f"{manifest.digest[:19]}; an immutable tag is never moved"
            )
        target, state = there, "already published"
    current = dst_reg.get_manifest(dest, image.tag)
    moving_updated = current is None or current.digest != target.digest
    if moving_updated:
        dst_reg.put_manifest(dest, image.tag, target)
    for tag in (immutable_tag, image.tag):
        served = dst_reg.get_manifest(dest, tag)
        if served is None or served.digest != target.digest:
            raise HaloError(
                f"{dest.ref(tag)}: after promotion the registry does not serve {target.digest[:19]}"
            )
    _attach_evidence(dst_reg, dest, src, target, manifest, evidence, progress)
    return Published(
        image, dest.ref(immutable_tag), dest.ref(image.tag), target.digest, state, moving_updated
    )


def _attach_evidence(
    dst_reg: Registry,
    dest: Repo,
    src: Ref,
    target: Manifest,
    staged: Manifest,
    evidence: Evidence,
    progress: Progress,
) -> None:
    """The released digest carries what let it through: the passing attestations (unless they
    are there already) and the override records."""
    from halo.testing.attest_store import attach

    if target.digest != staged.digest:
        # Already published as another digest of the same image: the attestations name the
        # staged one, so they stay with it.
        if evidence.overrides:
            progress(f"{dest}: override recorded beside {staged.digest[:19]} only (here locally)")
        return
    carried = [*(evidence.accepted if dest != src.repo else ()), *evidence.overrides]
    if carried:
        added = attach(dst_reg, dest, target, carried)
        progress(f"{dest.ref(target.digest)}: {added} attestations attached")


def _fingerprint(registry: Registry, repo: Repo, manifest: Manifest, index: int) -> str:
    from halo.registry.layers import layer_fingerprint

    digest = str(manifest.blobs()[1 + index]["digest"])
    with registry.open_blob(repo, digest) as blob:
        return layer_fingerprint(blob)


def copy_if_needed(
    src_reg: Registry,
    src: Repo,
    dst_reg: Registry,
    dest: Repo,
    manifest: Manifest,
    progress: Progress,
) -> int:
    from halo.registry.transfer import copy_image

    if src == dest:
        return 0
    return copy_image(src_reg, src, dst_reg, dest, manifest, progress)


def local_image_for_inputs(repo: Path, image: Image) -> tuple[str, str]:
    """The local image built from the checkout's inputs, as (immutable ref, image ID).

    The input hash is recomputed here; the image must carry it in its label too, or it is
    not what halo built for these inputs.
    """
    from halo.images.buildplan import resolve_inputs
    from halo.images.catalog import load_catalog
    from halo.images.docker import Docker

    docker = Docker.discover()
    docker.ping()
    inputs = resolve_inputs(repo, load_catalog(repo), image, docker)
    ref = image.immutable_ref(inputs.hash)
    image_id = docker.image_id(ref)
    if image_id is None:
        raise HaloError(
            f"{ref}: not built here for the checkout's inputs; run `halo image build {image.name}` first"
        )
    label = docker.inspect(ref, f'{{{{index .Config.Labels "{INPUT_LABEL}"}}}}')
    if label != inputs.hash:
        raise HaloError(
            f"{ref}: its {INPUT_LABEL} label is {label[:12] or 'missing'}, not {inputs.hash[:12]}"
        )
    return ref, image_id


def stage(repo: Path, image: Image, staging: str, progress: Progress) -> tuple[str, int]:
    """Push the image built for the checkout's inputs, by digest; returns (REPO@digest, uploads)."""
    if image.stage_of:
        raise HaloError(
            f"images.{image.name}: a CI stage of images.{image.stage_of} (kernels omitted), "
            f"never published; push {image.stage_of}"
        )
    from halo.images.build import rehash_for_push
    from halo.images.docker import Docker
    from halo.images.provenance import annotations
    from halo.paths import cache_home, scratch_root
    from halo.registry.transfer import ExportCache, push_local

    ref, image_id = local_image_for_inputs(repo, image)
    rehash_for_push(repo, image)  # what leaves the machine is hashed again, stamps not trusted
    dest = repo_under(staging, image.publish)
    registry = Registry(dest.host)
    work = scratch_root() / "export"
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        manifest, uploaded = push_local(
            registry,
            dest,
            Docker.discover().exe,
            ref,
            image_id,
            annotations(repo),
            Path(tmp),
            ExportCache(cache_home() / "exports"),
            progress,
        )
    _stage_attestations(registry, dest, manifest, image_id, progress)
    return dest.ref(manifest.digest), uploaded


def _stage_attestations(
    registry: Registry, dest: Repo, manifest: Manifest, image_id: str, progress: Progress
) -> None:
    """The image's test attestations recorded here go with it, as referrers of its digest."""
    from halo.testing.attest import read, unique
    from halo.testing.attest_run import local_store
    from halo.testing.attest_store import attach

    store = local_store()
    found = unique([*store.for_digest(image_id), *store.for_digest(manifest.digest)])
    if found:
        added = attach(registry, dest, manifest, [read(e) for e in found])
        progress(
            f"{dest.ref(manifest.digest)}: {len(found)} test attestations ({added} new) attached"
        )


def push(
    repo: Path,
    image: Image,
    registry: str,
    progress: Progress,
    override: Override | None = None,
) -> Published:
    staged, _ = stage(repo, image, registry, progress)
    return promote(image, staged, registry, progress, override, repo)


@dataclass(frozen=True)
class PublicCheck:
    ref: str
    digest: str
    blobs: int


def verify_public(image: Image, registry: str) -> list[PublicCheck]:
    """Pull both tags' manifest by digest, and check every blob, with no credentials at all."""
    dest = repo_under(registry, image.publish)
    anon = Registry(dest.host, anonymous=True)
    moving = anon.get_manifest(dest, image.tag)
    if moving is None:
        raise HaloError(f"{dest.ref(image.tag)}: not found by an anonymous pull")
    facts = Facts.of(_config(anon, dest, moving), dest.ref(image.tag))
    immutable_tag = f"{image.tag}-{facts.input_hash[:12]}"
    checks = []
    for tag in (image.tag, immutable_tag):
        by_tag = anon.get_manifest(dest, tag)
        if by_tag is None or by_tag.digest != moving.digest:
            raise HaloError(f"{dest.ref(tag)}: anonymous pull does not serve {moving.digest[:19]}")
        by_digest = anon.get_manifest(dest, by_tag.digest)
        if by_digest is None:
            raise HaloError(f"{dest.ref(by_tag.digest)}: manifest not pullable anonymously")
        blobs = by_digest.blobs()
        for desc in blobs:
            if not anon.has_blob(dest, str(desc["digest"])):
                raise HaloError(f"{dest.ref(str(desc['digest']))}: blob not pullable anonymously")
        checks.append(PublicCheck(dest.ref(tag), by_tag.digest, len(blobs)))
    return checks
