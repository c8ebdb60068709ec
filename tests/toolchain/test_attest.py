"""Test results as data: statements and envelopes built and checked, the gate, the cache key.

No Docker and no registry here (test_attest_promote.py and test_publish_e2e.py have those):
the formats through the in-toto bindings and securesystemslib, with throwaway keys.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from attest_support import TestKey, statement, tamper
from support import REPO, halo

from halo.errors import HaloError
from halo.store.maintenance import gc_store, verify_store
from halo.store.store import Store
from halo.testing.attest import (
    FAILED,
    PASSED,
    PREDICATE_TYPE,
    WARNED,
    Keys,
    RunInputs,
    checkout_tests_hash,
    envelope,
    junit_names,
    load_public_keys,
    load_signer,
    outcome_of,
    read,
    verify,
)
from halo.testing.attest_gate import cached_pass, gate
from halo.testing.attest_store import LocalAttestations

CONFIG = "sha256:" + "c" * 64
MANIFEST = "sha256:" + "d" * 64
OTHER = "sha256:" + "e" * 64
TESTS = "1" * 64
DIGESTS = {CONFIG, MANIFEST}


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> TestKey:
    return TestKey.make(tmp_path_factory.mktemp("keys"), "ci")


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> TestKey:
    return TestKey.make(tmp_path_factory.mktemp("keys"), "stranger")


def _gate(data: bytes, key: TestKey, tier: str = "cpu") -> str:
    (verdict,) = gate([tier], [data], key.keys.trusted, DIGESTS, TESTS)
    return "" if verdict.accepted else verdict.line()


def test_a_signed_statement_reads_back_and_verifies_with_the_trusted_key(key: TestKey) -> None:
    st = statement((CONFIG, MANIFEST), tests=TESTS, pytest_args=("-rs",))
    data = envelope(st, key.signer)
    doc = json.loads(data)
    assert doc["payloadType"] == "application/vnd.in-toto+json" and len(doc["signatures"]) == 1
    att = read(data)
    assert att.statement == st and att.predicate_type == PREDICATE_TYPE
    assert verify(att, key.keys.trusted) == (key.keys.keyid, "")
    assert _gate(data, key) == ""  # a reporting option is still the whole tier


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (
            lambda p: p["subject"][1]["digest"].update(sha256="e" * 64),
            "its signature does not verify",
        ),
        (lambda p: p["predicate"].update(result="PASSED"), "its signature does not verify"),
        (
            lambda p: p["predicate"]["configuration"][2]["digest"].update(sha256=TESTS),
            "its signature does not verify",
        ),
    ],
    ids=["subject", "result", "tests"],
)
def test_a_statement_changed_after_signing_is_refused(key: TestKey, change, why: str) -> None:  # type: ignore[no-untyped-def]
    signed = envelope(statement((CONFIG, MANIFEST), result=FAILED, tests="2" * 64), key.signer)
    changed = tamper(signed, change)
    assert read(changed).statement is not None, "still a readable statement"
    assert why in _gate(changed, key)
    # The unchanged one is refused for what it says, not for its signature.
    assert "its signature" not in _gate(signed, key)


def test_unknown_key_unsigned_wrong_subject_failed_other_tests_partial_are_refused(
    key: TestKey, stranger: TestKey
) -> None:
    cases = {
        "signed by an unknown key": envelope(
            statement((CONFIG, None), tests=TESTS), stranger.signer
        ),
        "unsigned": envelope(statement((CONFIG, None), tests=TESTS)),
        f"its subject {OTHER[:19]} is not this image": envelope(
            statement((OTHER, None), tests=TESTS), key.signer
        ),
        "result FAILED": envelope(statement((CONFIG, None), "cpu", FAILED, TESTS), key.signer),
        "for other tests": envelope(statement((CONFIG, None), tests="2" * 64), key.signer),
        "ran part of the tier (pytest -k test_config)": envelope(
            statement((CONFIG, None), tests=TESTS, pytest_args=("-k", "test_config")), key.signer
        ),
    }
    for why, data in cases.items():
        line = _gate(data, key)
        assert line.startswith("tier cpu: 1 found, none valid") and why in line, (why, line)
    assert _gate(envelope(statement((CONFIG, None), "gpu_core", tests=TESTS), key.signer), key) == (
        "tier cpu: no attestation"
    )
    # The manifest digest alone, or the config digest alone, is this image.
    assert _gate(envelope(statement((OTHER, MANIFEST), tests=TESTS), key.signer), key) == ""


def test_another_predicate_type_is_refused(key: TestKey) -> None:
    from google.protobuf import json_format
    from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
    from in_toto_attestation.v1.statement import Statement
    from securesystemslib.dsse import Envelope

    subject = ResourceDescriptor(name="halo", digest={"sha256": "c" * 64}).pb
    provenance = Statement([subject], "https://slsa.dev/provenance/v1", {"buildDefinition": {}})
    payload = json.dumps(json_format.MessageToDict(provenance.pb)).encode()
    env = Envelope(payload, "application/vnd.in-toto+json", {})
    env.sign(key.signer)
    data = json.dumps(env.to_dict()).encode()
    assert (
        read(data).problem == "predicate type https://slsa.dev/provenance/v1, not test-result v0.1"
    )
    assert "not test-result v0.1" in _gate(data, key)
    assert read(b"{not json").problem == "not a DSSE envelope"


def test_the_checkout_tests_hash_follows_each_test_file_and_the_pytest_config(
    tmp_path: Path,
) -> None:
    (tmp_path / "tests" / "cpu").mkdir(parents=True)
    (tmp_path / "halo").mkdir()
    (tmp_path / "tests" / "cpu" / "test_a.py").write_text("def test_a(): pass\n")
    (tmp_path / "tests" / "cpu" / "test_b.py").write_text("def test_b(): pass\n")
    (tmp_path / "halo" / "x.py").write_text("X = 1\n")
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = ["-ra"]\n')
    first = checkout_tests_hash(tmp_path)
    assert checkout_tests_hash(tmp_path) == first
    (tmp_path / "tests" / "cpu" / "__pycache__").mkdir()
    (tmp_path / "tests" / "cpu" / "__pycache__" / "test_a.pyc").write_bytes(b"\0")
    assert checkout_tests_hash(tmp_path) == first, "bytecode is not a test"
    seen = {first}
    for edit in (
        lambda: (tmp_path / "tests" / "cpu" / "test_b.py").write_text("def test_b(): assert 0\n"),
        lambda: (tmp_path / "halo" / "x.py").write_text("X = 2\n"),
        lambda: (tmp_path / "pyproject.toml").write_text(
            '[tool.pytest.ini_options]\naddopts = ["-ra", "-x"]\n'
        ),
        lambda: (tmp_path / "tests" / "cpu" / "test_c.py").write_text(""),
    ):
        edit()
        now = checkout_tests_hash(tmp_path)
        assert now not in seen
        seen.add(now)
    # Other tables of pyproject.toml are not pytest's configuration.
    text = (tmp_path / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(text + "[tool.ruff]\nline-length = 99\n")
    assert checkout_tests_hash(tmp_path) in seen


def test_a_cached_pass_needs_the_same_inputs_and_a_key_this_machine_trusts(
    key: TestKey, stranger: TestKey
) -> None:
    inputs = RunInputs("cpu", ("-rs",), ("--read-only",), TESTS)
    st = statement((CONFIG, None), tests=TESTS, pytest_args=("-rs",))
    st = type(st)(st.subjects, inputs, st.outcome)
    signed = envelope(st, key.signer)
    own = Keys(key.signer)  # its own key: trusted for the cache, whatever HALO_TRUSTED_KEYS says
    assert cached_pass([signed], own.own_and_trusted(), False, {CONFIG}, inputs) is not None
    for other in (
        RunInputs("cpu", ("-rs", "-x"), ("--read-only",), TESTS),  # other arguments
        RunInputs("cpu", ("-rs",), (), TESTS),  # other placement
        RunInputs("cpu", ("-rs",), ("--read-only",), "2" * 64),  # one test file changed
        RunInputs("gpu_core", ("-rs",), ("--read-only",), TESTS),
    ):
        assert cached_pass([signed], own.own_and_trusted(), False, {CONFIG}, other) is None
    assert cached_pass([signed], own.own_and_trusted(), False, {OTHER}, inputs) is None
    strangers = Keys(stranger.signer).own_and_trusted()
    assert cached_pass([signed], strangers, False, {CONFIG}, inputs) is None
    unsigned = envelope(st)
    assert cached_pass([unsigned], own.own_and_trusted(), False, {CONFIG}, inputs) is None
    assert cached_pass([unsigned], [], True, {CONFIG}, inputs) is not None, (
        "no key: unsigned counts"
    )
    failed = envelope(
        type(st)(st.subjects, inputs, statement((CONFIG, None), result=FAILED).outcome), key.signer
    )
    assert cached_pass([failed], own.own_and_trusted(), False, {CONFIG}, inputs) is None


def test_junit_names_and_results(tmp_path: Path) -> None:
    report = tmp_path / "r.xml"
    report.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="tests.cpu.test_a" name="test_ok"/>'
        '<testcase classname="tests.cpu.test_a" name="test_skip"><skipped message="no GPU"/></testcase>'
        '<testcase classname="tests.cpu.test_a" name="test_bad"><failure message="x"/></testcase>'
        '<testcase classname="tests.cpu.test_a" name="test_ok"><error message="teardown"/></testcase>'
        "</testsuite></testsuites>"
    )
    names = junit_names(report)
    assert names is not None
    assert names.passed == []
    assert names.failed == ["tests/cpu/test_a.py::test_bad", "tests/cpu/test_a.py::test_ok"]
    assert names.skipped == ["tests/cpu/test_a.py::test_skip"]
    assert outcome_of(1, names, "t").result == FAILED
    names.failed = []
    assert outcome_of(0, names, "t").result == WARNED, "all skipped proves nothing"
    names.passed = ["a::b"]
    assert outcome_of(0, names, "t").result == PASSED
    assert outcome_of(1, names, "t").result == FAILED, "pytest's exit status counts"
    assert junit_names(tmp_path / "missing.xml") is None


def test_local_attestations_are_kept_by_subject_and_left_alone_by_store_gc_and_verify(
    tmp_path: Path, key: TestKey
) -> None:
    root = tmp_path / "store"
    local = LocalAttestations.under(root)
    data = envelope(statement((CONFIG, MANIFEST), tests=TESTS), key.signer)
    paths = local.add(data, DIGESTS)
    assert len(paths) == 2 and local.for_digest(CONFIG) == local.for_digest(MANIFEST) == [data]
    assert local.add(data, [CONFIG]) == [paths[0]], "the same bytes once"
    assert local.for_digest(OTHER) == []
    assert not [p for p in (root / "attestations").rglob("*") if ".tmp" in p.name]
    with pytest.raises(HaloError, match="refusing subject"):
        local.add(data, ["../../etc"])
    gc_store(Store(root), [])
    verify_store(Store(root), [])
    assert local.for_digest(CONFIG) == [data], "gc and verify left them alone"


def test_keys_are_ed25519_pem_and_bad_ones_are_one_line(tmp_path: Path, key: TestKey) -> None:
    assert load_signer(key.key.read_text()).public_key.keyid == key.keys.keyid, "PEM text works too"
    both = load_public_keys(f"{key.pub}{os.pathsep}{key.pub}")
    assert [k.keyid for k in both] == [key.keys.keyid] * 2
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
    )

    other = tmp_path / "ec.pem"
    other.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
        )
    )
    with pytest.raises(HaloError, match="an ed25519 private key is expected"):
        load_signer(str(other))
    with pytest.raises(HaloError, match="not a PEM private key"):
        load_signer(str(key.pub))
    with pytest.raises(HaloError, match="cannot read the key"):
        Keys.from_env({"HALO_TRUSTED_KEYS": str(tmp_path / "missing.pub")})


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(
    tmp_path: Path,
) -> None:
    proc = halo("attest", "keygen", str(tmp_path / "ci"), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE((tmp_path / "ci").stat().st_mode) == 0o600
    assert (tmp_path / "ci.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")
    again = halo("attest", "keygen", str(tmp_path / "ci"), cwd=REPO)
    assert again.returncode == 2
    assert (
        again.stderr.strip()
        == f"halo: error: {tmp_path / 'ci'}: already exists; a key is never overwritten"
    )
    inside = halo("attest", "keygen", "ci-key", cwd=REPO)
    assert inside.returncode == 2 and "a private key never goes there" in inside.stderr
    assert not (REPO / "ci-key").exists()


def test_native_runs_record_nothing(repo_copy: Path, tmp_path: Path, key: TestKey) -> None:
    tier = repo_copy / "tests" / "gpu_full"
    for f in tier.glob("test_*.py"):
        f.unlink()
    (tier / "test_tiny.py").write_text(
        "import pytest\n\n\n@pytest.mark.gpu_full\ndef test_tiny():\n    pass\n"
    )
    env = {
        **key.env(),
        "HALO_SCRATCH": str(tmp_path / "scratch"),
        "HALO_STORE": str(tmp_path / "s"),
    }
    proc = halo("test", "gpu-full", "--native", cwd=repo_copy, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not (tmp_path / "s" / "attestations").exists()
    assert "recorded" not in proc.stderr
