"""A test result as data: an in-toto Statement (test-result v0.1) signed in a DSSE envelope.

Written and read through the in-toto attestation bindings and securesystemslib's DSSE, never
by hand; both are imported here only, and this module only by the commands that record or
check results (`halo --help` and the trainer never load it).

The Statement (https://in-toto.io/Statement/v1):

- ``subject``: the image that ran. Its config digest (the docker image ID: it pins every layer's
  content and the runtime config), and its registry manifest digest when the run named the
  image ``REPO@sha256:…``. Both as ``sha256`` digests.
- ``predicateType``: https://in-toto.io/attestation/test-result/v0.1, whose ``predicate`` is:
  ``result`` PASSED | FAILED | WARNED; ``configuration``, three resource descriptors: ``tier``
  (annotation ``tier``: the catalog's name, cpu, gpu_core, stack), ``arguments`` (annotation
  ``arguments``: the pytest arguments after ``--`` and the placement flags, sha256 of their
  JSON) and ``tests`` (sha256 of the checkout's tests tree, see checkout_tests_hash);
  ``url`` (the CI run, when there is one); ``passedTests``, ``failedTests``.
- halo's extension fields in the predicate (consumers ignore fields they do not know):
  ``skippedTests`` the tests that were skipped (a GPU test without a GPU: never a pass, and
  the predicate has no field for them); ``finishedOn`` when the run ended (RFC 3339, UTC);
  ``override`` {who, why}: a promotion that went ahead without a passing result (WARNED).

PASSED means pytest exited 0, nothing failed, and at least one test passed: a tier whose tests
were all skipped proved nothing, and is WARNED.
"""

from __future__ import annotations

import base64
import json
import os
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from halo.errors import HaloError
from halo.hashing import canonical_json, sha256_bytes, sha256_json, sha256_tree

PREDICATE_TYPE = "https://in-toto.io/attestation/test-result/v0.1"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
ENVELOPE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
PASSED, FAILED, WARNED = "PASSED", "FAILED", "WARNED"
KEY_ENV = "HALO_ATTEST_KEY"
TRUSTED_ENV = "HALO_TRUSTED_KEYS"
# What the tests tree hash covers: the tests, the halo package (the tier's container mounts the
# checkout and its halo shadows the image's), and pytest's configuration.
TESTS_TREE = ("tests", "halo")
# pytest options that only change what is printed: a run with any other pytest argument
# (-k, -m, a path, --deselect, -x…) proves part of a tier.
REPORTING_ONLY = ("-v", "-vv", "-vvv", "-q", "-qq", "-s")
REPORTING_PREFIXES = ("-r", "--durations=", "--durations-min=", "--tb=", "--color=")


@dataclass(frozen=True)
class Subject:
    name: str
    digest: str  # sha256:<hex>
    media_type: str = ""


@dataclass(frozen=True)
class RunInputs:
    """What a result is tied to besides the image: the cache key and the gate's conditions."""

    tier: str  # the catalog's name: cpu, gpu_core, rollout_vllm, stack
    pytest_args: tuple[str, ...] = ()
    placement: tuple[str, ...] = ()  # --read-only, --user=1000:1000, --gpus…
    tests: str = ""  # checkout_tests_hash of the checkout that ran it

    @property
    def arguments(self) -> dict[str, list[str]]:
        return {"pytest": list(self.pytest_args), "placement": list(self.placement)}

    def partial(self) -> list[str]:
        """The pytest arguments that select or stop tests (the run proved part of the tier)."""
        return [
            a
            for a in self.pytest_args
            if not (a in REPORTING_ONLY or a.startswith(REPORTING_PREFIXES))
        ]


@dataclass(frozen=True)
class Outcome:
    result: str
    passed: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    finished_on: str = ""
    url: str = ""
    override: tuple[str, str] | None = None  # (who, why)


@dataclass(frozen=True)
class ResultStatement:
    subjects: tuple[Subject, ...]
    inputs: RunInputs
    outcome: Outcome

    def digests(self) -> set[str]:
        return {s.digest for s in self.subjects}


@dataclass(frozen=True)
class Attestation:
    """One envelope as found, and what it says (``problem`` when it says nothing we read)."""

    envelope: bytes
    statement: ResultStatement | None
    keyids: tuple[str, ...]
    problem: str = ""
    predicate_type: str = ""

    @property
    def id(self) -> str:
        return sha256_bytes(self.envelope)


# -- the tests tree ----------------------------------------------------------------------------


def pytest_config(repo: Path) -> dict[str, Any]:
    path = repo / "pyproject.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise HaloError(f"{path}: cannot read pytest's configuration ({exc})") from None
    return dict(((data.get("tool") or {}).get("pytest") or {}).get("ini_options") or {})


def checkout_tests_hash(repo: Path) -> str:
    """sha256 of what a tier runs from the checkout: tests/ and halo/ (their relative paths and
    bytes) and pytest's configuration. Changing any one test file changes it."""
    parts: dict[str, Any] = {"pytest": pytest_config(repo)}
    for name in TESTS_TREE:
        parts[name] = sha256_tree(repo / name) if (repo / name).is_dir() else ""
    return sha256_json(parts)


# -- keys --------------------------------------------------------------------------------------


def _pem(value: str, what: str) -> bytes:
    """A PEM key named by a path, or given as the PEM text itself (a CI secret)."""
    if value.lstrip().startswith("-----BEGIN"):
        return value.encode()
    try:
        return Path(value).read_bytes()
    except OSError as exc:
        raise HaloError(f"{what}={value}: cannot read the key ({exc.strerror})") from None


def load_signer(value: str, what: str = KEY_ENV) -> Any:
    """An ed25519 securesystemslib CryptoSigner from a PEM private key."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner

    shown = value if not value.lstrip().startswith("-----") else "<PEM>"
    try:
        key = load_pem_private_key(_pem(value, what), password=None)
    except (ValueError, TypeError) as exc:
        raise HaloError(
            f"{what}={shown}: not a PEM private key without a password ({exc})"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise HaloError(f"{what}={shown}: an ed25519 private key is expected")
    return CryptoSigner(key)


def _public_pems(value: str, what: str) -> list[bytes]:
    if value.lstrip().startswith("-----BEGIN"):
        marker = b"-----BEGIN"
        text = value.encode()
        return [marker + chunk for chunk in text.split(marker)[1:]]
    return [_pem(p, what) for p in value.split(os.pathsep) if p.strip()]


def load_public_keys(value: str, what: str = TRUSTED_ENV) -> list[Any]:
    """securesystemslib SSlibKeys (ed25519) from PEM public keys: paths separated by os.pathsep,
    or the PEM text itself."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
    from securesystemslib.signer import SSlibKey

    keys = []
    for pem in _public_pems(value, what):
        try:
            key = load_pem_public_key(pem)
        except (ValueError, TypeError) as exc:
            raise HaloError(f"{what}: not a PEM public key ({exc})") from None
        if not isinstance(key, Ed25519PublicKey):
            raise HaloError(f"{what}: an ed25519 public key is expected")
        keys.append(SSlibKey.from_crypto(key))
    return keys


@dataclass(frozen=True)
class Keys:
    """The signing key (or None: results are recorded unsigned) and the keys trusted."""

    signer: Any = None
    trusted: tuple[Any, ...] = ()

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Keys:
        env = dict(os.environ) if env is None else env
        key = env.get(KEY_ENV, "").strip()
        trusted = env.get(TRUSTED_ENV, "").strip()
        return cls(
            load_signer(key) if key else None,
            tuple(load_public_keys(trusted)) if trusted else (),
        )

    @property
    def keyid(self) -> str:
        return str(self.signer.public_key.keyid) if self.signer is not None else ""

    def own_and_trusted(self) -> list[Any]:
        own = [self.signer.public_key] if self.signer is not None else []
        return [*own, *self.trusted]


def keygen(path: Path) -> str:
    """Write a new ed25519 key: ``path`` (PKCS#8 PEM, 0600) and ``path``.pub; returns its keyid."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    from securesystemslib.signer import CryptoSigner

    from halo.atomic import write_bytes

    pub = path.with_name(path.name + ".pub")
    for p in (path, pub):
        if p.exists() or p.is_symlink():
            raise HaloError(f"{p}: already exists; a key is never overwritten")
    signer = CryptoSigner.generate_ed25519()
    public = signer.public_key._crypto_key().public_bytes(
        Encoding.PEM, PublicFormat.SubjectPublicKeyInfo
    )
    write_bytes(path, signer.private_bytes, mode=0o600)
    write_bytes(pub, public, mode=0o644)
    return str(signer.public_key.keyid)


# -- writing -----------------------------------------------------------------------------------


def _descriptor(**kwargs: Any) -> Any:
    from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor

    return ResourceDescriptor(**kwargs).pb


def statement_dict(st: ResultStatement) -> dict[str, Any]:
    """The Statement as JSON data, made by the in-toto bindings (and validated by them)."""
    from google.protobuf import json_format
    from in_toto_attestation.predicates.test_result.v0 import test_result_pb2
    from in_toto_attestation.v1.statement import Statement

    inputs, outcome = st.inputs, st.outcome
    result = test_result_pb2.TestResult(
        result=outcome.result,
        url=outcome.url,
        passed_tests=list(outcome.passed),
        failed_tests=list(outcome.failed),
        configuration=[
            _descriptor(name="tier", annotations={"tier": inputs.tier}),
            _descriptor(
                name="arguments",
                digest={"sha256": sha256_json(inputs.arguments)},
                annotations={"arguments": inputs.arguments},
            ),
            _descriptor(
                name="tests",
                digest={"sha256": inputs.tests},
                annotations={"covers": [*(f"{t}/" for t in TESTS_TREE), "pytest configuration"]},
            ),
        ],
    )
    predicate = json_format.MessageToDict(result)
    if outcome.skipped:
        predicate["skippedTests"] = list(outcome.skipped)
    if outcome.finished_on:
        predicate["finishedOn"] = outcome.finished_on
    if outcome.override is not None:
        predicate["override"] = {"who": outcome.override[0], "why": outcome.override[1]}
    subjects = [
        _descriptor(
            name=s.name,
            digest={"sha256": s.digest.removeprefix("sha256:")},
            media_type=s.media_type,
        )
        for s in st.subjects
    ]
    statement = Statement(subjects, PREDICATE_TYPE, predicate)
    statement.validate()
    data: dict[str, Any] = json_format.MessageToDict(statement.pb)
    return data


def envelope(st: ResultStatement, signer: Any = None) -> bytes:
    """The DSSE envelope (JSON bytes) of ``st``, signed when ``signer`` is given."""
    from securesystemslib.dsse import Envelope

    env = Envelope(canonical_json(statement_dict(st)), PAYLOAD_TYPE, {})
    if signer is not None:
        env.sign(signer)
    return canonical_json(env.to_dict())


# -- reading -----------------------------------------------------------------------------------


def _struct_list(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _parse_statement(payload: bytes) -> tuple[ResultStatement | None, str, str]:
    """(statement, predicate type, problem) of a payload."""
    from google.protobuf import json_format
    from in_toto_attestation.predicates.test_result.v0 import test_result_pb2
    from in_toto_attestation.v1 import statement_pb2
    from in_toto_attestation.v1.statement import Statement

    try:
        pb = json_format.Parse(payload, statement_pb2.Statement())
        Statement.copy_from_pb(pb).validate()
    except (json_format.ParseError, ValueError, UnicodeDecodeError) as exc:
        return None, "", f"not an in-toto Statement ({str(exc)[:80]})"
    if pb.predicate_type != PREDICATE_TYPE:
        return None, pb.predicate_type, f"predicate type {pb.predicate_type}, not test-result v0.1"
    predicate = json_format.MessageToDict(pb.predicate)
    try:
        result = json_format.ParseDict(
            predicate, test_result_pb2.TestResult(), ignore_unknown_fields=True
        )
    except json_format.ParseError as exc:
        return None, pb.predicate_type, f"not a test-result predicate ({str(exc)[:80]})"
    config = {d.name: d for d in result.configuration}
    annotations = {name: json_format.MessageToDict(d.annotations) for name, d in config.items()}
    arguments = annotations.get("arguments", {}).get("arguments") or {}
    override = predicate.get("override")
    st = ResultStatement(
        subjects=tuple(
            Subject(s.name, f"sha256:{s.digest['sha256']}", s.media_type)
            for s in pb.subject
            if "sha256" in s.digest
        ),
        inputs=RunInputs(
            tier=str(annotations.get("tier", {}).get("tier", "")),
            pytest_args=_struct_list(
                arguments.get("pytest") if isinstance(arguments, dict) else None
            ),
            placement=_struct_list(
                arguments.get("placement") if isinstance(arguments, dict) else None
            ),
            tests=str(config["tests"].digest.get("sha256", "")) if "tests" in config else "",
        ),
        outcome=Outcome(
            result=result.result,
            passed=tuple(result.passed_tests),
            failed=tuple(result.failed_tests),
            skipped=_struct_list(predicate.get("skippedTests")),
            finished_on=str(predicate.get("finishedOn", "")),
            url=result.url,
            override=(str(override.get("who", "")), str(override.get("why", "")))
            if isinstance(override, dict)
            else None,
        ),
    )
    return st, pb.predicate_type, ""


def read(data: bytes) -> Attestation:
    """An envelope as found (a store, a registry): never raises for what it holds."""
    try:
        doc = json.loads(data)
        payload = base64.b64decode(doc["payload"], validate=True)
        payload_type = doc["payloadType"]
        keyids = tuple(str(s.get("keyid", "")) for s in doc.get("signatures") or ())
    except (ValueError, KeyError, TypeError, AttributeError):
        return Attestation(data, None, (), "not a DSSE envelope")
    if payload_type != PAYLOAD_TYPE:
        return Attestation(data, None, keyids, f"payload type {payload_type}, not in-toto")
    st, ptype, problem = _parse_statement(payload)
    return Attestation(data, st, keyids, problem, ptype)


def verify(att: Attestation, keys: Sequence[Any]) -> tuple[str, str]:
    """(keyid that verified, "") or ("", why not): unsigned, an unknown key, a broken signature."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import FormatError, VerificationError

    if not att.keyids:
        return "", "unsigned"
    known = {k.keyid for k in keys}
    if not known.intersection(att.keyids):
        return "", f"signed by an unknown key {att.keyids[0][:12]}"
    try:
        env = Envelope.from_dict(json.loads(att.envelope))
        accepted = env.verify(list(keys), 1)
    except (VerificationError, FormatError, ValueError, KeyError, TypeError):
        return "", "its signature does not verify (changed after signing)"
    return next(iter(accepted)), ""


# -- results from pytest -----------------------------------------------------------------------


@dataclass
class JunitNames:
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def junit_names(path: Path) -> JunitNames | None:
    """Test names (pytest's node ids) by outcome, from pytest's junit XML; None without one."""
    from halo.junit import read_cases, read_counts

    if read_counts(path) is None:
        return None
    status: dict[str, str] = {}
    for case in read_cases(path):
        now = "failed" if case.outcome in ("failed", "error") else case.outcome
        # A test that passed and then errored in teardown is reported twice: failed wins.
        if status.get(case.nodeid) != "failed":
            status[case.nodeid] = now
    out = JunitNames()
    for name, state in sorted(status.items()):
        getattr(out, state).append(name)
    return out


def outcome_of(rc: int, names: JunitNames, finished_on: str, url: str = "") -> Outcome:
    # Nothing failed but nothing passed either (every test skipped): that proved nothing.
    result = FAILED if rc != 0 or names.failed else PASSED if names.passed else WARNED
    return Outcome(
        result,
        tuple(names.passed),
        tuple(names.failed),
        tuple(names.skipped),
        finished_on,
        url,
    )


def ci_run_url(env: dict[str, str] | None = None) -> str:
    env = dict(os.environ) if env is None else env
    parts = [env.get(k, "") for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID")]
    return f"{parts[0]}/{parts[1]}/actions/runs/{parts[2]}" if all(parts) else ""


def subjects_named(
    name: str, config_digest: str, manifest: tuple[str, str] | None
) -> tuple[Subject, ...]:
    """The subjects of a run: the config digest, and (digest, media type) of its manifest."""
    out = [Subject(name, config_digest, CONFIG_MEDIA_TYPE)]
    if manifest is not None:
        out.insert(0, Subject(name, manifest[0], manifest[1]))
    return tuple(out)


def unique(envelopes: Iterable[bytes]) -> list[bytes]:
    seen: dict[str, bytes] = {}
    for data in envelopes:
        seen.setdefault(sha256_bytes(data), data)
    return list(seen.values())
