"""Recording a run's result: which image ran (its digests), what it proved, where it is kept.

Used by `halo test TIER --image REF` (and `halo stack verify SET --image NAME`, tier "stack"):
before the run, a passing result for the same image, tier, arguments and tests tree is reused;
after it, the result is signed (HALO_ATTEST_KEY), kept beside the image under the store root,
and, when the image was named ``REPO@sha256:…``, attached to it in that registry.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from halo.errors import HaloError
from halo.testing.attest import (
    Attestation,
    Keys,
    Outcome,
    ResultStatement,
    RunInputs,
    Subject,
    envelope,
    read,
    subjects_named,
)
from halo.testing.attest_gate import cached_pass
from halo.testing.attest_store import LocalAttestations, attach

Say = Callable[[str], None]


def now_utc() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Target:
    """The image a run used: its subjects, and where it lives in a registry (if by digest)."""

    ref: str
    subjects: tuple[Subject, ...]
    registry_ref: str | None = None  # REPO@sha256:… when the run named it so

    @property
    def config_digest(self) -> str:
        return self.subjects[-1].digest

    def digests(self) -> set[str]:
        return {s.digest for s in self.subjects}


def target_of(ref: str) -> Target:
    """``ref``'s digests: the docker image ID (its config digest) from the engine, and the
    manifest digest when ``ref`` is pinned by one (its media type asked of the registry)."""
    from halo.images.docker import Docker

    image_id = Docker.discover().image_id(ref)
    if image_id is None:
        raise HaloError(f"{ref}: not an image here; nothing to attest")
    name, _, digest = ref.partition("@")
    manifest = None
    registry_ref = None
    if digest:
        from halo.registry.refs import parse_ref

        try:
            parse_ref(ref)
            registry_ref = ref
        except HaloError:
            pass  # a local name pinned by digest: no registry to attach to
        manifest = (digest, "")
    short = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
    subjects = subjects_named(short, image_id, manifest)
    return Target(ref, subjects, registry_ref)


def _registry_manifest(registry_ref: str):  # type: ignore[no-untyped-def]
    from halo.registry.client import Registry
    from halo.registry.refs import parse_ref

    src = parse_ref(registry_ref)
    registry = Registry(src.repo.host)
    manifest = registry.get_manifest(src.repo, str(src.digest))
    if manifest is None:
        raise HaloError(f"{registry_ref}: not found in its registry; cannot attach the attestation")
    return registry, src.repo, manifest


def reuse(
    store: LocalAttestations, keys: Keys, target: Target, inputs: RunInputs
) -> Attestation | None:
    envelopes = [e for d in sorted(target.digests()) for e in store.for_digest(d)]
    return cached_pass(
        envelopes, keys.own_and_trusted(), keys.signer is None, target.digests(), inputs
    )


def cached_line(tier: str, att: Attestation, target: Target) -> str:
    st = att.statement
    assert st is not None
    return (
        f"tier {tier}: passed at {st.outcome.finished_on or 'an earlier run'}, same inputs "
        f"(image {target.config_digest[:19]}, tests {st.inputs.tests[:12]}); --rerun runs it again"
    )


def record(
    store: LocalAttestations,
    keys: Keys,
    target: Target,
    inputs: RunInputs,
    outcome: Outcome,
    say: Say,
) -> Attestation:
    """Sign (when a key is configured), keep locally, attach in the registry; one line each."""
    subjects = target.subjects
    registry = None
    if target.registry_ref is not None:
        try:
            registry, repo, manifest = _registry_manifest(target.registry_ref)
        except HaloError as exc:
            say(f"tier {inputs.tier}: warning: {exc.message}")
        else:
            subjects = tuple(
                Subject(s.name, s.digest, manifest.media_type) if s.digest == manifest.digest else s
                for s in subjects
            )
    att = read(envelope(ResultStatement(subjects, inputs, outcome), keys.signer))
    paths = store.add(att.envelope, {s.digest for s in subjects})
    signed = (
        f"signed by key {keys.keyid[:12]}"
        if keys.signer is not None
        else "UNSIGNED (no HALO_ATTEST_KEY): promote will not accept it"
    )
    say(
        f"tier {inputs.tier}: {outcome.result} recorded for {target.config_digest[:19]}, "
        f"{signed} ({paths[0].parent})"
    )
    if registry is not None:
        # Not fatal: the result stands and is kept here. A job that may only pull (a pull
        # request from a fork) still tests; promote, which looks there, will say it found none.
        try:
            added = attach(registry, repo, manifest, [att])
        except HaloError as exc:
            say(
                f"tier {inputs.tier}: warning: attestation not attached to "
                f"{target.registry_ref} ({exc.message}); a promote from there will not find it"
            )
        else:
            say(
                f"tier {inputs.tier}: attestation attached to {target.registry_ref} "
                f"({'new' if added else 'already there'})"
            )
    return att


def local_store() -> LocalAttestations:
    from halo.paths import store_root

    return LocalAttestations.under(store_root())


def repo_root() -> Path:
    from halo.paths import find_repo

    return find_repo()
