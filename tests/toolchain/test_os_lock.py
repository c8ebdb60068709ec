"""The OS lock (pins/debian.BASE.lock.toml): Debian versions, relations and the lock's invariants.

Pure: small fixture locks, no archive, no mmdebstrap. The committed locks are checked too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from support import REPO, halo

from halo.errors import HaloError
from halo.pins.deblock import (
    Deb,
    DebInputs,
    DebLock,
    check_deb_lock,
    load_deb_lock,
    parse_deb_lock,
    render_deb_lock,
)
from halo.pins.deblocking import drift, lock_bases
from halo.pins.debversion import compare, parse_relations

SHA = "ab" * 32


def _deb(name: str, version: str = "1.0-1", **fields: object) -> Deb:
    return Deb(
        name=name,
        version=version,
        architecture=str(fields.pop("architecture", "amd64")),
        filename=f"pool/main/{name[0]}/{name}/{name}_{version.split(':')[-1]}_amd64.deb",
        size=1000,
        sha256=SHA,
        **fields,  # type: ignore[arg-type]
    )


INPUTS = DebInputs("tiny", "bookworm", "minbase", ("app",))


def _lock(*debs: Deb, essential: tuple[str, ...] = ("libc6",)) -> DebLock:
    return DebLock(INPUTS, essential, debs)


GOOD = _lock(
    _deb("libc6", "2.36-9+deb12u10", essential=True),
    _deb("app", "2:1.2~rc1-3", depends="libc6 (>= 2.34), mail-transport-agent | libc6:any"),
    _deb("lib-mta", "0.5", provides="mail-transport-agent (= 0.5)"),
    _deb("tool", "1.0", pre_depends="libc6 (<< 3)", depends="app (>= 2:1.2~), lib-mta"),
)


@pytest.mark.parametrize(
    ("a", "b", "sign"),
    [
        ("1.0", "1.0", 0),
        ("1.0~rc1", "1.0", -1),  # ~ sorts before the empty string
        ("1.0", "1.0+deb12u1", -1),
        ("2:1.0", "10.0", 1),  # the epoch first
        ("1.10", "1.9", 1),  # digits numerically
        ("1.0a", "1.0+", -1),  # letters before other characters
        ("2.36-9+deb12u10", "2.36-9+deb12u9", 1),
        ("1.0-1", "1.0-1~bpo1", 1),
    ],
)
def test_debian_version_order_is_dpkgs(a: str, b: str, sign: int) -> None:
    got = compare(a, b)
    assert (got > 0) - (got < 0) == sign
    assert (compare(b, a) > 0) - (compare(b, a) < 0) == -sign


def test_relations_parse_alternatives_versions_and_arch_qualifiers() -> None:
    groups = parse_relations("a (>= 1.2) | b:any, c [amd64], d (<< 2~)")
    assert [[str(r) for r in g] for g in groups] == [["a (>= 1.2)", "b"], ["c"], ["d (<< 2~)"]]
    with pytest.raises(ValueError, match="not a Debian relation"):
        parse_relations("Bad Name")


def test_a_complete_lock_holds_every_invariant_and_round_trips() -> None:
    assert check_deb_lock(GOOD, "tiny", INPUTS) == []
    text = render_deb_lock(GOOD)
    again = parse_deb_lock(text, "tiny")
    assert render_deb_lock(again) == text  # same lock, same bytes
    assert [d.name for d in again.debs] == sorted(d.name for d in GOOD.debs)
    assert check_deb_lock(again, "tiny", INPUTS) == []


def _broken(name: str) -> DebLock:
    debs = {d.name: d for d in GOOD.debs}
    if name == "missing dependency":
        debs.pop("lib-mta")
    elif name == "version too old":
        debs["libc6"] = dataclasses.replace(debs["libc6"], version="2.31-13")
    elif name == "second version":
        return _lock(*debs.values(), dataclasses.replace(debs["app"], version="2:1.3-1"))
    elif name == "essential absent":
        return _lock(*debs.values(), essential=("libc6", "dash"))
    elif name == "bad sha256":
        debs["tool"] = dataclasses.replace(debs["tool"], sha256="AB" * 32)
    elif name == "foreign file":
        debs["tool"] = dataclasses.replace(debs["tool"], filename="pool/main/x/x/x_1_amd64.deb")
    return _lock(*debs.values())


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("missing dependency", {"tiny: tool: closure (Depends lib-mta not in the lock)"}),
        ("version too old", {"tiny: app: closure (Depends libc6 (>= 2.34) not in the lock)"}),
        ("second version", {"tiny: app: one-version (locked as 2:1.2~rc1-3, 2:1.3-1)"}),
        (
            "essential absent",
            {"tiny: dash: essential (the archive's Essential set must be installed)"},
        ),
        ("bad sha256", {f"tiny: tool: sha256 (not 64 lowercase hex digits: '{'AB' * 32}')"}),
        (
            "foreign file",
            {"tiny: tool: filename (not a pool/… path of it: 'pool/main/x/x/x_1_amd64.deb')"},
        ),
    ],
)
def test_each_broken_invariant_is_one_line(name: str, expected: set[str]) -> None:
    assert set(check_deb_lock(_broken(name), "tiny")) == expected


def test_a_lock_for_other_inputs_is_drift_and_names_the_fix() -> None:
    wanted = dataclasses.replace(INPUTS, packages=("app", "tool"))
    (line,) = check_deb_lock(GOOD, "tiny", wanted)
    assert "base: inputs (catalog asks bookworm/minbase +app,tool" in line
    assert "`halo pins lock --os tiny`" in line


def test_lock_keeps_a_lock_that_answers_its_inputs_and_resolves_when_they_change(
    tmp_path: Path,
) -> None:
    """Stable: the archive moving on does not move a lock; changed inputs do (so does --upgrade)."""
    calls: list[DebInputs] = []

    def resolve(inputs: DebInputs) -> DebLock:
        calls.append(inputs)
        return dataclasses.replace(GOOD, inputs=inputs)

    assert lock_bases(tmp_path, [INPUTS], resolve) == {"tiny": "written"}
    assert lock_bases(tmp_path, [INPUTS], resolve)["tiny"].startswith("kept")
    assert len(calls) == 1  # no resolution: nothing the archive serves today can move it
    assert lock_bases(tmp_path, [INPUTS], resolve, upgrade=True) == {"tiny": "unchanged"}
    wanted = dataclasses.replace(INPUTS, packages=("app", "tool"))
    assert drift(tmp_path, wanted)
    assert lock_bases(tmp_path, [wanted], resolve) == {"tiny": "written"}
    assert drift(tmp_path, wanted) == []


def test_a_resolution_that_breaks_the_closure_is_not_written(tmp_path: Path) -> None:
    with pytest.raises(HaloError, match="closure"):
        lock_bases(tmp_path, [INPUTS], lambda i: _broken("missing dependency"))
    assert list(tmp_path.iterdir()) == []


def test_hand_edited_lock_is_refused_by_key(tmp_path: Path) -> None:
    text = render_deb_lock(GOOD).replace("size = 1000", 'size = "big"', 1)
    with pytest.raises(HaloError, match=r"package\[0\]\.size: Input should be a valid integer"):
        parse_deb_lock(text, "tiny")


def test_the_committed_os_locks_hold_their_invariants() -> None:
    from halo.images.base import deb_inputs
    from halo.images.catalog import load_catalog

    catalog = load_catalog(REPO)
    for name, base in catalog.bases.items():
        lock = load_deb_lock(REPO / "pins" / f"debian.{name}.lock.toml")
        assert check_deb_lock(lock, name, deb_inputs(base)) == [], name
    proc = halo("pins", "lock", "--os", "--check", cwd=REPO)
    assert proc.returncode == 0, proc.stderr


def test_a_made_root_that_differs_from_its_lock_is_refused(tmp_path: Path) -> None:
    """What mmdebstrap installed is compared with the lock: a variant that picks packages by a
    field the local repository lacks (Priority) once left apt out, silently."""
    from halo.images.base import _same_as_lock
    from halo.images.catalog import Base

    base = Base("tiny", "mmdebstrap", "python3", "bookworm", "minbase", ("app",))
    rows = [f"{d.name}\t{d.version}\t{d.architecture}" for d in GOOD.debs]
    installed = tmp_path / "installed.tsv"
    installed.write_text("\n".join(rows) + "\n")
    _same_as_lock(base, GOOD, installed)
    installed.write_text("\n".join(rows[1:]) + "\n")
    with pytest.raises(HaloError, match=r"not installed \['libc6 2\.36-9\+deb12u10'\]"):
        _same_as_lock(base, GOOD, installed)
