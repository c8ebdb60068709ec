"""Reading every input file the same way: UTF-8 text, strict YAML/TOML, typed schemas.

One layer for the catalog, `pins/sets.toml`, `pins/sources.toml`, locks, `ci/matrix.yaml`
and trainer configs, so each fault gets the same kind of answer: a `HaloError` naming the
file (and key path), never a traceback.

- `read_text(path)`: UTF-8 or one line naming the byte offset; OSErrors (permission, a
  directory, a missing file) become one line naming the path.
- `load_yaml(text, origin)`: a SafeLoader that rejects duplicate keys (PyYAML silently keeps
  the last one) and reads `1e-5` as a float, as people mean it; errors name the line.
- `load_toml(text, origin)`: tomllib, with its error as one line.
- `validate(model, data, origin)`: a pydantic model (strict, unknown keys forbidden), with
  every problem reported at once, each as ``key.path: what was expected``.
- `Problems`: the same, for a file checked in parts (each entry on its own, then what ties
  entries together), so one bad entry does not hide the problems of the others.
- Field types shared by the input files: `Name`, `OciRepository`, `OciTag`, `Sha256Hex`,
  `RelativePath`, and `Strict`, the model base (unknown keys forbidden, no coercion).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError

from halo.errors import HaloError

M = TypeVar("M")


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise HaloError(f"{path}: not found") from None
    except IsADirectoryError:
        raise HaloError(f"{path}: is a directory, expected a file") from None
    except OSError as exc:
        raise HaloError(f"{path}: cannot read ({exc.strerror or exc})") from None


def decode(data: bytes, origin: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise HaloError(
            f"{origin}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}, line {line})"
        ) from None


def read_text(path: Path) -> str:
    return decode(read_bytes(path), str(path))


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and reads 1e-5 as a float."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, f"unhashable key {key!r}", key_node.start_mark
                ) from None
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {seen[key] + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping
)
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)$"),
    list("-+0123456789"),
)


def load_yaml(text: str, origin: str) -> Any:
    """Strict YAML (no duplicate keys); a syntax error is one line naming where it is."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark is not None else ""
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise HaloError(f"{origin}:{where} malformed YAML: {problem}") from None


def load_toml(text: str, origin: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise HaloError(f"{origin}: not valid TOML: {exc}") from None


def read_yaml(path: Path) -> Any:
    return load_yaml(read_text(path), str(path))


def read_toml(path: Path) -> dict[str, Any]:
    return load_toml(read_text(path), str(path))


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def problems(exc: Exception) -> list[str]:
    """A pydantic ValidationError as ``key.path: message`` lines, in document order."""
    out = []
    for err in exc.errors():  # type: ignore[attr-defined]
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "missing":
            msg = "required"
        elif err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")  # our own messages name the value already
        elif "input" in err:
            value = err["input"]
            shown = repr(value) if not isinstance(value, dict | list) else type(value).__name__
            msg = f"{msg}, got {shown[:80]}"
        out.append(f"{_loc(tuple(err['loc']))}: {msg}")
    return out


def _summary(origin: str, found: list[str]) -> HaloError:
    """``FILE: key: what was expected``; several problems as ``FILE: N problems: ...; ...``."""
    if len(found) == 1:
        return HaloError(f"{origin}: {found[0]}")
    return HaloError(f"{origin}: {len(found)} problems: " + "; ".join(found))


def validate(model: type[M], data: Any, origin: str) -> M:
    """``data`` as ``model`` (a pydantic BaseModel), or one HaloError listing every problem."""
    try:
        return model.model_validate(data)  # type: ignore[attr-defined,no-any-return]
    except ValidationError as exc:
        raise _summary(origin, problems(exc)) from None


class Problems:
    """Every problem of one file, collected across its parts, raised as one line at the end."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.found: list[str] = []

    def model(self, model: type[M], data: Any, where: str = "") -> M | None:
        """``data`` as ``model``; on failure its problems are kept (prefixed by ``where``)."""
        try:
            return model.model_validate(data)  # type: ignore[attr-defined,no-any-return]
        except ValidationError as exc:
            for line in problems(exc):
                key, _, msg = line.partition(": ")
                path = where if key == "(top level)" else (f"{where}.{key}" if where else key)
                path = path.replace(".[", "[")
                self.found.append(f"{path or '(top level)'}: {msg}")
            return None

    def add(self, where: str, message: str) -> None:
        self.found.append(f"{where}: {message}")

    def check(self) -> None:
        if self.found:
            raise _summary(self.origin, self.found)


class Strict(BaseModel):
    """Input file models: unknown keys are errors, and a value is never coerced into a type
    (YAML's `tag: 0.10` is the float 0.1, not the string "0.10")."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=False)


def matches(pattern: str, what: str) -> AfterValidator:
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"expected {what}, got {value!r}")
        return value

    return AfterValidator(check)


def _quoted_hint(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError(
            f"expected a string, YAML read the number {value!r}: put the value in quotes"
        )
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
        raise ValueError(f"expected a path inside the repository, got {value!r}")
    return value


RelativePath = Annotated[str, AfterValidator(_relative)]
