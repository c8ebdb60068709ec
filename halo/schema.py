"""Reading every input file the same way: UTF-8 text, strict YAML/TOML, typed schemas.

One layer for the catalog, `pins/sets.toml`, `pins/sources.toml`, locks, `ci/matrix.yaml`
and trainer configs, so each fault gets the same kind of answer: a `HaloError` naming the
file (and key path), never a traceback.

- `read_text(path)`: UTF-8 or one line naming the byte offset; OSErrors (permission, a
  directory, a missing file) become one line naming the path.
- `load_yaml(text, origin)`: a SafeLoader that rejects duplicate keys (PyYAML silently keeps
  the last one) and reads `1e-5` as a float, as people mean it.
- `load_toml(text, origin)`: tomllib, with its error as one line.
- `validate(model, data, origin)`: a pydantic model (strict, unknown keys forbidden), with
  every problem reported at once, each as ``key.path: what was expected``.
- `Problems`: the same, for a file checked in parts (each entry on its own, then what ties
  entries together), so one bad entry does not hide the problems of the others.
- Field types shared by the input files: `Name`, `OciRepository`, `OciTag`, `Sha256Hex`,
  `RelativePath`, `matches(pattern, what)`, and `Strict`, the model base (unknown keys
  forbidden, no coercion). They live in halo.schema_types and are imported from here on first
  use: pydantic costs a few hundred ms to import, which a no-op build does not pay.
"""

from __future__ import annotations

import functools
import re
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from halo.errors import HaloError

_TYPES = ("Strict", "matches", "Name", "OciRepository", "OciTag", "Sha256Hex", "RelativePath")


def __getattr__(name: str) -> Any:
    if name in _TYPES:
        from halo import schema_types

        return getattr(schema_types, name)
    raise AttributeError(f"module 'halo.schema' has no attribute {name!r}")


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


@functools.cache
def _strict_loader() -> type:
    """A SafeLoader (libyaml's when PyYAML has it) that refuses duplicate keys and reads 1e-5
    as a float. Made on first use: yaml is not imported by commands that read no YAML."""
    import yaml

    class StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
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
            return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]

    StrictLoader.add_constructor(
        yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, StrictLoader.construct_mapping
    )
    StrictLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)$"),
        list("-+0123456789"),
    )
    return StrictLoader


def load_yaml(text: str, origin: str) -> Any:
    """Strict YAML (no duplicate keys); a syntax error is one line naming where it is."""
    import yaml

    try:
        return yaml.load(text, Loader=_strict_loader())  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise HaloError(f"{origin}: not valid YAML: {' '.join(str(exc).split())}") from None


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
        elif "input" in err and err["type"] not in ("missing",):
            value = err["input"]
            shown = repr(value) if not isinstance(value, dict | list) else type(value).__name__
            msg = f"{msg}, got {shown[:80]}"
        out.append(f"{_loc(tuple(err['loc']))}: {msg}")
    return out


def _summary(origin: str, found: list[str]) -> HaloError:
    """``FILE: N problem(s): key: what was expected; ...`` on one line."""
    n = len(found)
    return HaloError(f"{origin}: {n} problem{'s' if n > 1 else ''}: " + "; ".join(found))


def validate(model: type[M], data: Any, origin: str) -> M:
    """``data`` as ``model`` (a pydantic BaseModel), or one HaloError listing every problem."""
    from pydantic import ValidationError

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
        from pydantic import ValidationError

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
