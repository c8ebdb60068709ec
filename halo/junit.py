"""pytest's JUnit XML as data: a run's counts, and each test case with its time and outcome.

Data only (no pytest, no subprocess): the tiers read their own report through it, and the CI
runner reads every session's reports through it for its table and its slowest tests.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

OUTCOMES = ("passed", "failed", "error", "skipped")


@dataclass(frozen=True)
class Counts:
    tests: int
    failures: int
    errors: int
    skipped: int
    seconds: float

    @property
    def passed(self) -> int:
        return self.tests - self.failures - self.errors - self.skipped

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.tests + other.tests,
            self.failures + other.failures,
            self.errors + other.errors,
            self.skipped + other.skipped,
            self.seconds + other.seconds,
        )


NONE = Counts(0, 0, 0, 0, 0.0)


@dataclass(frozen=True)
class Case:
    """One test: ``classname`` is pytest's dotted module path (and class), ``name`` the test."""

    classname: str
    name: str
    seconds: float
    outcome: str  # one of OUTCOMES

    @property
    def nodeid(self) -> str:
        """pytest's node id, as far as JUnit keeps it: tests/x/test_y.py::Class::test_z[param]."""
        parts = self.classname.split(".")
        # The module's path ends at the first part that names a test module; a class follows.
        cut = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        module = "/".join(parts[: cut + 1]) + ".py"
        return "::".join([module, *parts[cut + 1 :], without_group(self.name)])


def without_group(name: str) -> str:
    """A test's name without the `@GROUP` that pytest-xdist's --dist loadgroup appends to the
    tests of an xdist_group (a scheduling detail, not the test's name). An `@` inside the
    parameters (a URL's user@host) stays."""
    head, bracket, tail = name.rpartition("]")
    if bracket:
        return head + bracket if tail.startswith("@") else name
    return name.split("@", 1)[0]


def _suite(path: Path) -> ET.Element | None:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    return root if root.tag == "testsuite" else root.find("testsuite")


def read_counts(path: Path) -> Counts | None:
    """The totals of one report; None when there is none (or it is not a report)."""
    if not path.is_file():
        return None
    suite = _suite(path)
    if suite is None:
        return None
    a = suite.attrib
    return Counts(
        int(a.get("tests", 0)),
        int(a.get("failures", 0)),
        int(a.get("errors", 0)),
        int(a.get("skipped", 0)),
        float(a.get("time", 0.0)),
    )


def read_cases(path: Path) -> list[Case]:
    """Every test case of one report, in its order."""
    suite = _suite(path) if path.is_file() else None
    if suite is None:
        return []
    cases = []
    for tc in suite.iter("testcase"):
        kinds = {child.tag for child in tc}
        outcome = (
            "failed"
            if "failure" in kinds
            else "error"
            if "error" in kinds
            else "skipped"
            if "skipped" in kinds
            else "passed"
        )
        cases.append(
            Case(
                tc.get("classname", ""),
                tc.get("name", ""),
                float(tc.get("time", 0.0) or 0.0),
                outcome,
            )
        )
    return cases
