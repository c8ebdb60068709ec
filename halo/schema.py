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
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, TypeVar

import yaml

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
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
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


def validate(model: type[M], data: Any, origin: str) -> M:
    """``data`` as ``model`` (a pydantic BaseModel), or one HaloError listing every problem."""
    from pydantic import ValidationError

    try:
        return model.model_validate(data)  # type: ignore[attr-defined,no-any-return]
    except ValidationError as exc:
        found = problems(exc)
        n = len(found)
        raise HaloError(
            f"{origin}: {n} problem{'s' if n > 1 else ''}: " + "; ".join(found)
        ) from None
