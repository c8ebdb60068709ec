"""Field types and the model base shared by the input files' schemas (see halo.schema).

Import them from halo.schema; this module exists so that reading files does not import pydantic.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict


class Strict(BaseModel):
    """Input file models: unknown keys are errors, and a value is never coerced into a type
    (YAML's `tag: 0.10` is the float 0.1, not the string "0.10")."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=False)


def matches(pattern: str, what: str) -> AfterValidator:
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"expected {what}")
        return value

    return AfterValidator(check)


def _quoted_hint(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError("expected a string, YAML read a number: put the value in quotes")
    return value


# A name of a set, image, base or source: what file names and references are made of.
Name = Annotated[str, matches(r"[a-z0-9][a-z0-9_.-]*", "a lowercase ASCII name")]
# OCI distribution spec: repository path components and tags. A tag leaves room for the
# immutable tag's "-<12 hex>" suffix (128 characters in all).
OciRepository = Annotated[
    str,
    matches(
        r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*",
        "an OCI repository name (lowercase ASCII letters, digits, separators . _ - /)",
    ),
]
OciTag = Annotated[
    str,
    BeforeValidator(_quoted_hint),
    matches(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,114}", "an OCI tag ([A-Za-z0-9_.-], at most 115)"),
]
Sha256Hex = Annotated[str, matches(r"[0-9a-f]{64}", "64 lowercase hex digits")]


def _relative(value: str) -> str:
    path = PurePosixPath(value)
    if not value or path.is_absolute() or ".." in path.parts or "\\" in value:
        raise ValueError("expected a path inside the repository")
    return value


RelativePath = Annotated[str, AfterValidator(_relative)]
