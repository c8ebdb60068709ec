"""Debian version order and dependency fields, as dpkg defines them (pure; no dpkg needed).

Used by the OS lock's closure check: every Depends/Pre-Depends of every locked .deb must be
satisfied inside the lock, which needs dpkg's version comparison (epochs, `~` sorting before
everything, letters before other characters) and the relation grammar
(``a (>= 1.2) | b:any, c``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RELATION_RE = re.compile(
    r"^(?P<name>[a-z0-9][a-z0-9+.-]*)(?::(?P<arch>[a-z0-9-]+))?"
    r"\s*(?:\(\s*(?P<op><<|<=|=|>=|>>)\s*(?P<version>[^)\s]+)\s*\))?"
    r"\s*(?:\[[^]]*\])?\s*(?:<[^>]*>)?$"
)


def _order(c: str) -> int:
    if c == "~":
        return -1
    if c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _compare_part(a: str, b: str) -> int:
    """dpkg's verrevcmp: alternate non-digit runs (by _order) and digit runs (numerically)."""
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) else 0
            bc = _order(b[j]) if j < len(b) else 0
            if ac != bc:
                return ac - bc
            i += 1
            j += 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first_diff:
                first_diff = ord(a[i]) - ord(b[j])
            i += 1
            j += 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return first_diff
    return 0


def _split(version: str) -> tuple[int, str, str]:
    epoch, _, rest = version.rpartition(":") if ":" in version else ("0", "", version)
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "")
    return int(epoch or 0), upstream, revision


def compare(a: str, b: str) -> int:
    """<0, 0 or >0 as Debian version ``a`` sorts before, equal to or after ``b``."""
    ea, ua, ra = _split(a)
    eb, ub, rb = _split(b)
    if ea != eb:
        return ea - eb
    return _compare_part(ua, ub) or _compare_part(ra, rb)


def satisfies(version: str, op: str, wanted: str) -> bool:
    c = compare(version, wanted)
    return {"<<": c < 0, "<=": c <= 0, "=": c == 0, ">=": c >= 0, ">>": c > 0}[op]


@dataclass(frozen=True)
class Relation:
    name: str
    op: str = ""
    version: str = ""

    def __str__(self) -> str:
        return f"{self.name} ({self.op} {self.version})" if self.op else self.name


def parse_relations(field: str) -> list[list[Relation]]:
    """``a (>= 1) | b, c`` as [[a>=1, b], [c]]: every group must hold, any member of a group.

    Raises ValueError naming the part that is not a relation.
    """
    groups: list[list[Relation]] = []
    for group in field.split(","):
        if not group.strip():
            continue
        alternatives = []
        for alt in group.split("|"):
            m = _RELATION_RE.match(alt.strip())
            if not m:
                raise ValueError(f"not a Debian relation: {alt.strip()!r}")
            alternatives.append(Relation(m["name"], m["op"] or "", m["version"] or ""))
        groups.append(alternatives)
    return groups
