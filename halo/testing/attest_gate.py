"""What an attestation is worth: the promote gate, and a cached result that a run may reuse.

The gate (halo image promote): for every tier the catalog requires of an image, at least one
attestation that is signed by a trusted key (the DSSE signature verifies), has the test-result
predicate type, names the staged manifest digest or its config digest as subject, is for that
tier, PASSED, ran the whole tier (no pytest argument that selects tests), and whose tests tree
hash equals the checkout's. Anything else is refused, and the refusal says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from halo.testing.attest import PASSED, Attestation, RunInputs, read, unique, verify


@dataclass(frozen=True)
class Verdict:
    tier: str
    accepted: Attestation | None
    reasons: tuple[str, ...]  # why each other attestation for this tier was not taken

    def line(self) -> str:
        if not self.reasons:
            return f"tier {self.tier}: no attestation"
        found = len(self.reasons)
        return f"tier {self.tier}: {found} found, none valid ({'; '.join(dict.fromkeys(self.reasons))})"


def judge(
    att: Attestation, trusted: Sequence[Any], digests: set[str], tier: str, tests: str
) -> str:
    """ "" when ``att`` proves ``tier`` passed on one of ``digests`` with ``tests``; else why not."""
    if att.statement is None:
        return att.problem or "unreadable"
    _, why = verify(att, trusted)
    if why:
        return why
    st = att.statement
    if not st.digests() & digests:
        return f"its subject {sorted(st.digests())[0][:19]} is not this image"
    if st.inputs.tier != tier:
        return f"for tier {st.inputs.tier}"
    if st.outcome.result != PASSED:
        return f"result {st.outcome.result}"
    if st.inputs.tests != tests:
        return f"for other tests (tree {st.inputs.tests[:12]}, the checkout's {tests[:12]})"
    if partial := st.inputs.partial():
        return f"ran part of the tier (pytest {' '.join(partial)})"
    return ""


def gate(
    required: Iterable[str],
    envelopes: Iterable[bytes],
    trusted: Sequence[Any],
    digests: set[str],
    tests: str,
) -> list[Verdict]:
    atts = [read(e) for e in unique(envelopes)]
    verdicts = []
    for tier in required:
        reasons = []
        accepted = None
        for att in atts:
            claimed = att.statement.inputs.tier if att.statement is not None else None
            if claimed is not None and claimed != tier:
                continue  # another tier's result: not evidence either way
            why = judge(att, trusted, digests, tier, tests)
            if not why:
                accepted = att
                break
            reasons.append(why)
        verdicts.append(Verdict(tier, accepted, () if accepted else tuple(reasons)))
    return verdicts


def cached_pass(
    envelopes: Iterable[bytes],
    keys: Sequence[Any],
    allow_unsigned: bool,
    digests: set[str],
    inputs: RunInputs,
) -> Attestation | None:
    """The latest passing result for exactly these inputs, that this machine may trust: signed
    by its own or a trusted key, or (no signing key configured) unsigned."""
    best: Attestation | None = None
    for att in (read(e) for e in unique(envelopes)):
        st = att.statement
        if st is None or st.outcome.result != PASSED or st.inputs != inputs:
            continue
        if not st.digests() & digests:
            continue
        keyid, _ = verify(att, keys)
        if not keyid and not (allow_unsigned and not att.keyids):
            continue
        if best is None or st.outcome.finished_on > best.statement.outcome.finished_on:  # type: ignore[union-attr]
            best = att
    return best
