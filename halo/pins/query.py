"""Questions about locks: what differs between two sets, and why a package is in a set. Pure."""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

from halo.pins.lockfile import Lock, normalize

REQ_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass(frozen=True)
class LockDiff:
    added: tuple[tuple[str, str], ...]  # in right only: (name, version)
    removed: tuple[tuple[str, str], ...]  # in left only
    changed: tuple[tuple[str, str, str], ...]  # (name, left version, right version)


def diff_locks(left: Lock, right: Lock) -> LockDiff:
    lv = {normalize(p.name): p.version for p in left.packages}
    rv = {normalize(p.name): p.version for p in right.packages}
    return LockDiff(
        added=tuple((n, rv[n]) for n in sorted(rv.keys() - lv.keys())),
        removed=tuple((n, lv[n]) for n in sorted(lv.keys() - rv.keys())),
        changed=tuple((n, lv[n], rv[n]) for n in sorted(lv.keys() & rv.keys()) if lv[n] != rv[n]),
    )


def render_diff(left: Lock, right: Lock, diff: LockDiff) -> str:
    from halo.report import table

    rows: list[tuple[str, str, str, str]] = [
        *(("added", n, "-", v) for n, v in diff.added),
        *(("removed", n, v, "-") for n, v in diff.removed),
        *(("changed", n, a, b) for n, a, b in diff.changed),
    ]
    summary = (
        f"{left.set} -> {right.set}: {len(diff.added)} added, {len(diff.removed)} removed, "
        f"{len(diff.changed)} changed"
    )
    if not rows:
        return summary
    return table(("change", "package", left.set, right.set), rows) + "\n" + summary


def requirement_name(line: str) -> str | None:
    m = REQ_NAME_RE.match(line)
    return normalize(m[1]) if m and not line.lstrip().startswith("-") else None


def why(lock: Lock, package: str) -> list[list[str]]:
    """Shortest chains from `package` up to each top-level requirement that brings it in.

    Each chain reads package <- parent <- ... <- `requirement line`.
    """
    target = normalize(package)
    if lock.package(target) is None:
        return []
    lines = [str(r) for r in lock.extra.get("requirements", [])]  # type: ignore[union-attr]
    roots: dict[str, list[str]] = {}
    for line in lines:
        if (name := requirement_name(line)) is not None:
            roots.setdefault(name, []).append(line)
    parents: dict[str, list[str]] = {normalize(p.name): [] for p in lock.packages}
    for pkg in lock.packages:
        for dep in pkg.dependencies:
            parents.setdefault(normalize(dep), []).append(normalize(pkg.name))
    chains: list[list[str]] = []
    seen = {target}
    queue: deque[list[str]] = deque([[target]])
    while queue:
        path = queue.popleft()
        node = path[-1]
        for line in roots.get(node, []):
            chains.append([*path, f"`{line}`"])
        for parent in sorted(parents.get(node, [])):
            if parent not in seen:
                seen.add(parent)
                queue.append([*path, parent])
    return chains
