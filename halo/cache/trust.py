"""Whether a binary cache entry may be used: what vouches for a derivation's output hash.

The registry is not trusted: anyone who can push there could publish a wheel with a record
that is consistent with itself. An entry is used only when, besides its bytes hashing to
the recorded output sha256, one of these vouches for exactly that (derivation, sha256):

- a signature over the record by a key in an OpenSSH allowed-signers file
  (``ssh-keygen -Y sign|verify``, namespace ``halo-cache``): CI signs what it pushes, every
  host verifies with the public keys (public keys are not credentials);
- a pinned digest: a TOML file ``[derivations] "<derivation hash>" = "<wheel sha256>"``.

OpenSSH is the edge: the only side effect here is running ``ssh-keygen``.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from halo.errors import HaloError
from halo.schema import read_toml, validate

NAMESPACE = "halo-cache"


class PinnedFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    derivations: dict[str, str]


def _ssh_keygen(args: list[str], data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(
            ["ssh-keygen", *args], input=data, capture_output=True, check=False, timeout=60
        )
    except FileNotFoundError:
        raise HaloError("ssh-keygen: not found; signed cache entries need OpenSSH") from None


def sign(record: bytes, key: Path) -> bytes:
    """An SSH signature of ``record`` by ``key`` (the private key file)."""
    with tempfile.TemporaryDirectory(prefix="halo-sign-") as tmp:
        data = Path(tmp) / "record.json"
        data.write_bytes(record)
        proc = _ssh_keygen(["-Y", "sign", "-q", "-f", str(key), "-n", NAMESPACE, str(data)])
        if proc.returncode != 0:
            raise HaloError(f"{key}: signing failed: {proc.stderr.decode().strip()}")
        return (Path(tmp) / "record.json.sig").read_bytes()


@dataclass(frozen=True)
class Trust:
    signers: Path | None = None  # OpenSSH allowed-signers file
    pinned: Path | None = None  # [derivations] "<hash>" = "<sha256>"

    def configured(self) -> bool:
        return self.signers is not None or self.pinned is not None

    def pinned_digest(self, drv_hash: str) -> str | None:
        if self.pinned is None:
            return None
        data = validate(PinnedFile, read_toml(self.pinned), str(self.pinned))
        return data.derivations.get(drv_hash)

    def signed_by(self, record: bytes, signature: bytes) -> str | None:
        """The principal of ``signers`` whose key signed ``record``, or None."""
        if self.signers is None:
            return None
        if not self.signers.is_file():
            raise HaloError(f"{self.signers}: allowed-signers file not found (HALO_CACHE_SIGNERS)")
        with tempfile.TemporaryDirectory(prefix="halo-verify-") as tmp:
            sig = Path(tmp) / "record.sig"
            sig.write_bytes(signature)
            found = _ssh_keygen(["-Y", "find-principals", "-s", str(sig), "-f", str(self.signers)])
            principals = found.stdout.decode().split() if found.returncode == 0 else []
            for principal in principals:
                proc = _ssh_keygen(
                    ["-Y", "verify", "-f", str(self.signers), "-I", principal, "-n", NAMESPACE,
                     "-s", str(sig)],
                    record,
                )  # fmt: skip
                if proc.returncode == 0:
                    return principal
        return None

    def why_not(
        self, drv_hash: str, sha256: str, record: bytes, signature: bytes | None
    ) -> str | None:
        """None when the entry is vouched for; else the reason, one line."""
        if not self.configured():
            return "no trust configured (HALO_CACHE_SIGNERS or HALO_CACHE_PINNED)"
        reasons = []
        if self.pinned is not None:
            pinned = self.pinned_digest(drv_hash)
            if pinned == sha256:
                return None
            reasons.append(
                f"{self.pinned} pins {pinned[:12]}, the entry holds {sha256[:12]}"
                if pinned
                else f"{self.pinned} pins nothing for it"
            )
        if self.signers is not None:
            if signature is None:
                reasons.append("it carries no signature")
            elif self.signed_by(record, signature) is not None:
                return None
            else:
                reasons.append(f"its signature is not by a key in {self.signers}")
        return "; ".join(reasons)
