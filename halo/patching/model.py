"""What a patch declares and what applying it reports. Plain data, no I/O."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field, replace

# Stands for the installed version in a patch's file names, snippets and markers: metadata
# lives in `<name>-<version>.dist-info/`, and a requirement line names the version too.
VERSION = "{version}"


class State(enum.StrEnum):
    APPLIED = "applied"
    ALREADY_APPLIED = "already-applied"
    FIXED_UPSTREAM = "fixed-upstream"
    NOT_INSTALLED = "not-installed"
    DRIFT = "drift"


@dataclass(frozen=True)
class Edit:
    """Replace ``defect`` by ``fix`` in one file (a path relative to the site directory).

    ``defect`` must occur exactly ``count`` times; anything else is drift, because a
    snippet that matches more or fewer places than upstream's code had is not the code
    this edit was written for. ``fix`` may contain ``defect``: the fix is looked for first.
    """

    file: str
    defect: str
    fix: str
    count: int = 1

    def __post_init__(self) -> None:
        if not self.defect or self.defect == self.fix:
            raise ValueError(
                f"{self.file}: an edit needs a non-empty defect that differs from its fix"
            )
        if self.count < 1:
            raise ValueError(f"{self.file}: count must be at least 1")


@dataclass(frozen=True)
class Marker:
    """A regular expression that, found in ``file``, shows upstream fixed the defect.

    Matched against the file's bytes, so a marker can also recognise a fix in a
    compiled library (for example an RPATH baked into a shared object).
    """

    file: str
    pattern: str

    def regex(self) -> re.Pattern[bytes]:
        return re.compile(self.pattern.encode(), re.MULTILINE)


@dataclass(frozen=True)
class Patch:
    """One fix to one distribution. Any matching marker in ``fixed_upstream`` switches it off."""

    name: str
    distribution: str
    versions: str
    summary: str
    edits: tuple[Edit, ...]
    fixed_upstream: tuple[Marker, ...]
    source: str = field(default="", compare=False)

    @property
    def files(self) -> list[str]:
        return sorted({e.file for e in self.edits})

    def at_version(self, version: str) -> Patch:
        """This patch with ``{version}`` replaced by the installed version (in markers: escaped)."""

        def text(s: str) -> str:
            return s.replace(VERSION, version)

        return replace(
            self,
            edits=tuple(
                replace(e, file=text(e.file), defect=text(e.defect), fix=text(e.fix))
                for e in self.edits
            ),
            fixed_upstream=tuple(
                replace(
                    m, file=text(m.file), pattern=m.pattern.replace(VERSION, re.escape(version))
                )
                for m in self.fixed_upstream
            ),
        )


@dataclass(frozen=True)
class Result:
    """One patch's state on one site directory; ``to_json`` is the documented shape."""

    name: str
    distribution: str
    version: str | None
    state: State
    files: list[str]
    detail: str

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "state": str(self.state),
            "files": list(self.files),
            "detail": self.detail,
        }
