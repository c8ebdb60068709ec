"""The promote gate against a real registry (Debian's docker-registry), through `halo image promote`.

Small images (a few bytes) stand in for halo's, each staged under a new digest so that only the
attestations a test attaches are there; the attestations are made by halo's own library and
attached as OCI referrers, as `halo test … --image REPO@sha256:…` attaches them. The real tier
run before a promote is test_publish_e2e.py's.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from attest_support import TestKey, attach_to, sign_passing, staged_digests, statement, tamper
from publish_support import Namespace, namespace, push_by_digest, small_image
from support import REPO, docker_or_skip, halo

from halo.images.docker import Docker
from halo.images.publish import INPUT_LABEL
from halo.registry.client import Registry
from halo.registry.refs import parse_ref, repo_under
from halo.testing.attest import FAILED, WARNED, envelope, read, verify
from halo.testing.attest_store import referrers

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def docker() -> Docker:
    return docker_or_skip()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[TestKey, TestKey]:
    folder = tmp_path_factory.mktemp("keys")
    return TestKey.make(folder, "ci"), TestKey.make(folder, "stranger")


@pytest.fixture
def ns() -> Iterator[Namespace]:
    yield from namespace()


@pytest.fixture
def env(keys: tuple[TestKey, TestKey], tmp_path: Path) -> dict[str, str]:
    """Sign and trust the CI key; an empty local store (only the registry holds results)."""
    return {**keys[0].env(), "HALO_STORE": str(tmp_path / "store")}


@pytest.fixture
def stage(ns: Namespace, docker: Docker) -> Iterator:  # type: ignore[type-arg]
    """Stage a small image under a new digest; returns REPO@sha256:…."""
    made: list[str] = []

    def _stage() -> str:
        ref = f"ship-test/gate-{uuid.uuid4().hex[:8]}:one"
        labels = {INPUT_LABEL: secrets.token_hex(32)}
        small_image(docker.exe, ref, {"opt/halo/x": secrets.token_bytes(8)}, 1, labels)
        made.append(ref)
        registry = ns.registry("staging")
        manifest = push_by_digest(docker.exe, ref, str(docker.image_id(ref)), registry)
        return ns.remember(repo_under(registry, "halo").ref(manifest.digest))

    yield _stage
    for ref in made:
        docker.remove(ref)


def _promote(ns: Namespace, staged: str, env: dict[str, str], *extra: str):  # type: ignore[no-untyped-def]
    release = ns.registry("release")
    ns.track(release, "halo")
    argv = ("image", "promote", "cpu", "--from", staged, "--registry", release, *extra)
    return halo(*argv, cwd=REPO, env=env)


def _refused(proc, why: str) -> str:  # type: ignore[no-untyped-def]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("halo: error: "), proc.stderr
    assert "not promoted: no valid passing attestation for tier cpu" in lines[0]
    assert why in lines[0], lines[0]
    return lines[0]


def _released(ns: Namespace, tag: str = "cpu") -> str | None:
    repo = repo_under(ns.registry("release"), "halo")
    manifest = Registry(repo.host).get_manifest(repo, tag)
    return manifest.digest if manifest else None


def test_promote_refuses_a_digest_without_its_tier_then_accepts_a_signed_pass(
    ns: Namespace, stage, keys: tuple[TestKey, TestKey], env: dict[str, str]
) -> None:  # type: ignore[no-untyped-def]
    staged = stage()
    line = _refused(_promote(ns, staged, env), "tier cpu: no attestation")
    assert f"run `halo test cpu --image {staged}`" in line
    assert _released(ns) is None, "nothing was published"

    verdict = halo("attest", "verify", "cpu", staged, cwd=REPO, env=env)
    assert verdict.returncode == 2 and "tier cpu: no attestation" in verdict.stderr

    sign_passing(staged, keys[0])
    verdict = halo("attest", "verify", "cpu", staged, cwd=REPO, env=env)
    assert verdict.returncode == 0, verdict.stderr
    assert verdict.stdout.startswith("tier cpu: passed at 2026-12-05T11:00:00Z, signed by trusted")

    done = _promote(ns, staged, env)
    assert done.returncode == 0, done.stderr
    assert "tier cpu: passed at" in done.stderr
    digest = parse_ref(staged).digest
    assert _released(ns) == digest
    # The released digest carries the result that let it through.
    repo = repo_under(ns.registry("release"), "halo")
    carried = [read(e) for e in referrers(Registry(repo.host), repo, str(digest))]
    assert [a.statement.inputs.tier for a in carried if a.statement] == ["cpu"]

    shown = halo("attest", "show", staged, cwd=REPO, env=env)
    assert shown.returncode == 0 and "PASSED" in shown.stdout and "trusted" in shown.stdout


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("tampered-subject", "its signature does not verify (changed after signing)"),
        ("tampered-result", "its signature does not verify (changed after signing)"),
        ("unknown-key", "signed by an unknown key"),
        ("unsigned", "unsigned"),
        ("wrong-subject", "is not this image"),
        ("failed", "result FAILED"),
        ("other-tests", "for other tests"),
        ("part-of-the-tier", "ran part of the tier (pytest -k test_config)"),
    ],
)
def test_promote_refuses_what_is_not_a_valid_pass_and_says_which(
    ns: Namespace,
    stage,  # type: ignore[no-untyped-def]
    keys: tuple[TestKey, TestKey],
    env: dict[str, str],
    case: str,
    why: str,
) -> None:
    ci, stranger = keys
    staged = stage()
    digests = staged_digests(staged)
    if case == "tampered-subject":
        # A pass of another image, its subject rewritten to this one: the signature breaks.
        other = staged_digests(stage())
        data = envelope(statement(other), ci.signer)
        data = tamper(
            data,
            lambda p: [
                s["digest"].update(sha256=d.removeprefix("sha256:"))
                for s, d in zip(p["subject"], reversed(digests), strict=True)
            ],
        )
    elif case == "tampered-result":
        data = envelope(statement(digests, result=FAILED), ci.signer)
        data = tamper(data, lambda p: p["predicate"].update(result="PASSED"))
        assert read(data).statement.outcome.result == "PASSED"  # type: ignore[union-attr]
    elif case == "unknown-key":
        data = envelope(statement(digests), stranger.signer)
    elif case == "unsigned":
        data = envelope(statement(digests))
    elif case == "wrong-subject":
        data = envelope(statement(staged_digests(stage())), ci.signer)
    elif case == "failed":
        data = envelope(statement(digests, result=FAILED), ci.signer)
    elif case == "other-tests":
        data = envelope(statement(digests, tests="0" * 64), ci.signer)
    else:
        data = envelope(statement(digests, pytest_args=("-k", "test_config")), ci.signer)
    attach_to(staged, data)
    _refused(_promote(ns, staged, env), why)
    assert _released(ns) is None


def test_override_names_who_and_why_and_is_recorded_signed_on_the_released_digest(
    ns: Namespace,
    stage,  # type: ignore[no-untyped-def]
    keys: tuple[TestKey, TestKey],
    env: dict[str, str],
) -> None:
    staged = stage()
    for bad in ("alice", "alice:", ": hotfix"):
        proc = _promote(ns, staged, env, "--override-tests", bad)
        assert proc.returncode == 2
        assert proc.stderr.strip().endswith('expected "WHO: WHY" (who overrides, and why)')
    unsigned = {**env, "HALO_ATTEST_KEY": ""}
    proc = _promote(ns, staged, unsigned, "--override-tests", "alice: hotfix")
    assert proc.returncode == 2 and "recorded in a signed attestation" in proc.stderr
    assert _released(ns) is None

    done = _promote(ns, staged, env, "--override-tests", "alice: CVE hotfix, tier rerun later")
    assert done.returncode == 0, done.stderr
    warning = [li for li in done.stderr.splitlines() if li.startswith("warning: ")]
    assert len(warning) == 1 and "overridden by alice: CVE hotfix, tier rerun later" in warning[0]
    digest = str(parse_ref(staged).digest)
    assert _released(ns) == digest
    repo = repo_under(ns.registry("release"), "halo")
    (att,) = [read(e) for e in referrers(Registry(repo.host), repo, digest)]
    assert att.statement is not None
    assert att.statement.outcome.result == WARNED
    assert att.statement.outcome.override == ("alice", "CVE hotfix, tier rerun later")
    assert digest in att.statement.digests()
    assert verify(att, keys[0].keys.trusted)[0], "signed by the promoting key"


def test_promote_without_trusted_keys_says_so(
    ns: Namespace,
    stage,  # type: ignore[no-untyped-def]
    keys: tuple[TestKey, TestKey],
    env: dict[str, str],
) -> None:
    staged = stage()
    sign_passing(staged, keys[0])
    _refused(
        _promote(ns, staged, {**env, "HALO_TRUSTED_KEYS": ""}),
        "no trusted keys (set HALO_TRUSTED_KEYS); tier cpu: 1 found, none valid",
    )


def test_a_server_image_is_gated_on_its_stack_proof_not_on_another_tier(
    ns: Namespace,
    stage,  # type: ignore[no-untyped-def]
    keys: tuple[TestKey, TestKey],
    env: dict[str, str],
) -> None:
    staged = stage()
    sign_passing(staged, keys[0], tier="cpu")  # a pass of a tier vllm's gate does not name
    release = ns.registry("release")
    ns.track(release, "vllm-server")
    argv = ("image", "promote", "vllm", "--from", staged, "--registry", release)
    refused = halo(*argv, cwd=REPO, env=env)
    assert refused.returncode == 2
    assert "no valid passing attestation for tier stack: tier stack: no attestation" in (
        refused.stderr
    )
    sign_passing(staged, keys[0], tier="stack")  # what `halo stack verify vllm --image` records
    done = halo(*argv, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr
    assert "tier stack: passed at" in done.stderr
