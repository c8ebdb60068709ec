"""`--training.max_steps=3 --lr=1e-5` -> edits of the raw config mapping.

A key is a dotted path from the top (`training.max_steps`) or, when unambiguous, just the
last part (`lr` -> `optim.lr`). Values are parsed as YAML (`3`, `1e-5`, `[0, 1]`, `null`).
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from halo.errors import HaloError
from halo.schema import load_yaml


def parse(args: list[str]) -> list[tuple[str, Any]]:
    out = []
    for arg in args:
        if arg == "--":
            continue
        if not arg.startswith("--") or "=" not in arg:
            raise HaloError(f"override {arg!r}: expected --KEY=VALUE, e.g. --training.max_steps=3")
        key, _, value = arg[2:].partition("=")
        if not key:
            raise HaloError(f"override {arg!r}: empty key")
        out.append((key, load_yaml(value, f"override {arg!r}") if value else ""))
    return out


def _section(tp: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``tp`` (``X``, ``X | None``), if any."""
    for arg in (tp, *typing.get_args(tp)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _leaf_paths(schema: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key path the schema accepts."""
    out = []
    for name, field in schema.model_fields.items():
        inner = _section(field.annotation)
        path = f"{prefix}{name}"
        out += _leaf_paths(inner, path + ".") if inner else [path]
    return out


def resolve_key(key: str, schema: type[BaseModel]) -> str:
    paths = _leaf_paths(schema)
    if key in paths or "." in key:
        return key
    matches = [p for p in paths if p.rsplit(".", 1)[-1] == key]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise HaloError(
            f"override --{key}: ambiguous, use one of {', '.join('--' + m for m in matches)}"
        )
    return key  # unknown: validation reports it with its path


def apply(
    raw: dict[str, Any],
    edits: list[tuple[str, Any]],
    schema: type[BaseModel],
    resolve_paths: Callable[[dict[str, Any], Path], None],
) -> None:
    """Edit ``raw`` in place; ``resolve_paths`` is the config's own (which keys are paths is
    the config's knowledge: this module only edits mappings, and sits below it)."""
    for key, value in edits:
        full = resolve_key(key, schema)
        node = raw
        parts = full.split(".")
        for part in parts[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise HaloError(f"override --{key}: {part} is not a section")
            node = nxt
        node[parts[-1]] = value
        if parts[0] in ("data", "model", "runtime"):
            # Paths typed on the command line are relative to where they were typed.
            single = {parts[0]: _subtree(raw[parts[0]], parts[1:])}
            resolve_paths(single, Path.cwd())
            node[parts[-1]] = _pick(single[parts[0]], parts[1:], value)


def _subtree(node: Any, parts: list[str]) -> Any:
    """A copy of ``node`` holding only the path ``parts`` (what resolve_paths should look at)."""
    if not parts or not isinstance(node, dict):
        return node
    head, rest = parts[0], parts[1:]
    return {head: _subtree(node.get(head), rest)} if head in node else {}


def _pick(node: Any, parts: list[str], default: Any) -> Any:
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node
