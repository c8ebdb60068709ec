"""Test support for test attestations: throwaway keys, and results signed through halo's library."""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support import REPO

from halo.registry.client import Registry
from halo.registry.refs import parse_ref
from halo.testing.attest import (
    PASSED,
    Keys,
    Outcome,
    ResultStatement,
    RunInputs,
    checkout_tests_hash,
    envelope,
    keygen,
    load_signer,
    read,
    subjects_named,
)
from halo.testing.attest_store import attach


@dataclass(frozen=True)
class TestKey:
    __test__ = False  # not a test class, whatever its name says to pytest
    key: Path
    pub: Path

    @classmethod
    def make(cls, folder: Path, name: str = "key") -> TestKey:
        folder.mkdir(parents=True, exist_ok=True)
        keygen(folder / name)
        return cls(folder / name, folder / f"{name}.pub")

    @classmethod
    def from_env(cls) -> TestKey:
        """The key a fixture configured (HALO_ATTEST_KEY, and it is trusted)."""
        key = Path(os.environ["HALO_ATTEST_KEY"])
        return cls(key, key.with_name(f"{key.name}.pub"))

    def env(self, trusted: TestKey | None = None) -> dict[str, str]:
        """Sign with this key; trust ``trusted`` (default: this key too)."""
        return {"HALO_ATTEST_KEY": str(self.key), "HALO_TRUSTED_KEYS": str((trusted or self).pub)}

    @property
    def signer(self) -> Any:
        return load_signer(str(self.key))

    @property
    def keys(self) -> Keys:
        return Keys.from_env(self.env())


def statement(
    digests: tuple[str, str | None],
    tier: str = "cpu",
    result: str = PASSED,
    tests: str | None = None,
    pytest_args: tuple[str, ...] = (),
    finished_on: str = "2026-12-05T11:00:00Z",
) -> ResultStatement:
    """A result for (config digest, manifest digest or None)."""
    config, manifest = digests
    subjects = subjects_named(
        "halo",
        config,
        (manifest, "application/vnd.oci.image.manifest.v1+json") if manifest else None,
    )
    return ResultStatement(
        subjects,
        RunInputs(tier, pytest_args, (), tests if tests is not None else checkout_tests_hash(REPO)),
        Outcome(result, ("tests/cpu/test_tiny.py::test_it",), finished_on=finished_on),
    )


def staged_digests(staged: str) -> tuple[str, str]:
    """(config digest, manifest digest) of a staged REPO@sha256:…."""
    src = parse_ref(staged)
    manifest = Registry(src.repo.host).get_manifest(src.repo, str(src.digest))
    assert manifest is not None
    return str(manifest.json["config"]["digest"]), manifest.digest


def attach_to(staged: str, data: bytes) -> None:
    """Attach an envelope to the staged digest, as `halo test … --image REPO@sha256` does."""
    src = parse_ref(staged)
    registry = Registry(src.repo.host)
    manifest = registry.get_manifest(src.repo, str(src.digest))
    assert manifest is not None
    attach(registry, src.repo, manifest, [read(data)])


def sign_passing(staged: str, key: TestKey, tier: str = "cpu") -> bytes:
    """A valid passing result of ``tier`` for the staged digest, attached to it."""
    data = envelope(statement(staged_digests(staged), tier), key.signer)
    attach_to(staged, data)
    return data


def tamper(data: bytes, change: Any) -> bytes:
    """The envelope with its payload changed by ``change(statement_dict)``, signature kept."""
    doc = json.loads(data)
    payload = json.loads(base64.b64decode(doc["payload"]))
    change(payload)
    doc["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    return json.dumps(doc).encode()
