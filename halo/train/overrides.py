"""`--training.max_steps=3 --lr=1e-5` -> edits of the raw config mapping.

A key is a dotted path from the top (`training.max_steps`) or, when unambiguous, just the
last part (`lr` -> `optim.lr`). Values are parsed as YAML (`3`, `1e-5`, `[0, 1]`, `null`).
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

from halo.errors import HaloError


def parse(args: list[str]) -> list[tuple[str, Any]]:
    from halo.train.config import parse_yaml

    out = []
    for arg in args:
        if arg == "--":
            continue
        if not arg.startswith("--") or "=" not in arg:
            raise HaloError(f"override {arg!r}: expected --KEY=VALUE, e.g. --training.max_steps=3")
        key, _, value = arg[2:].partition("=")
        if not key:
            raise HaloError(f"override {arg!r}: empty key")
        out.append((key, parse_yaml(value, f"override {arg!r}") if value else ""))
    return out


def _leaf_paths(schema: type, prefix: str = "") -> list[str]:
    """Every dotted key path the schema accepts."""
    hints = typing.get_type_hints(schema)
    out = []
    for f in dataclasses.fields(schema):
        tp = hints[f.name]
        inner = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)] or (
            [tp] if dataclasses.is_dataclass(tp) else []
        )
        path = f"{prefix}{f.name}"
        if inner:
            out += _leaf_paths(inner[0], path + ".")
        else:
            out.append(path)
    return out


def resolve_key(key: str, schema: type) -> str:
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


def apply(raw: dict[str, Any], edits: list[tuple[str, Any]], schema: type) -> None:
    for key, value in edits:
        full = resolve_key(key, schema)
        node = raw
        parts = full.split(".")
        for part in parts[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise HaloError(f"override --{key}: {part} is not a section")
            node = nxt
        if isinstance(value, str) and parts[-1] in {"checkpoints", "logs", "train", "init_from"}:
            # Paths typed on the command line are relative to where they were typed.
            value = str(Path(value).resolve()) if value else value
        node[parts[-1]] = value
