"""Lock, re-check and load pin sets: the glue between inputs, the resolver and pins/pylock.*.toml."""

from __future__ import annotations

import difflib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from halo.errors import HaloError
from halo.pins.inputs import PinInputs, SetInputs, load_inputs
from halo.pins.lockfile import Lock, load_lock, lock_name, lock_path, parse_lock, render_lock
from halo.pins.resolve import (
    NO_UPGRADE,
    Preferences,
    Resolver,
    Upgrade,
    build_lock,
    file_size,
    lock_header,
    preferences,
)
from halo.pins.source_pins import SourcePin, load_source_pins


@dataclass(frozen=True)
class PinState:
    """Everything `halo pins check` looks at: inputs, every lock, the source pins."""

    inputs: PinInputs
    locks: dict[str, Lock]
    sources: tuple[SourcePin, ...]


def load_locks(pins_dir: Path, names: list[str]) -> list[Lock]:
    inputs = load_inputs(pins_dir)
    return [load_lock(lock_path(pins_dir, s.name)) for s in inputs.select(names)]


def load_all(pins_dir: Path) -> PinState:
    inputs = load_inputs(pins_dir)
    locks = {name: load_lock(lock_path(pins_dir, name)) for name in inputs.sets}
    return PinState(inputs=inputs, locks=locks, sources=load_source_pins(pins_dir))


def committed_lock(pins_dir: Path, name: str) -> Lock | None:
    """The set's committed lock, the re-resolution's preferences; None before the first lock."""
    path = lock_path(pins_dir, name)
    if not path.is_file():
        return None
    try:
        return load_lock(path)
    except HaloError as exc:
        raise HaloError(
            f"{exc.message} (its pins are the re-lock's preferences; "
            f"`halo pins lock --upgrade {name}` re-resolves without them)"
        ) from None


def twin_of(inputs: PinInputs, name: str) -> str | None:
    """The set a platform twin (blackwell-arm64) was made from (blackwell); None for a set."""
    for base in inputs.sets:
        if (
            name != base
            and name.startswith(f"{base}-")
            and name.removeprefix(f"{base}-") in (PLATFORM_TWINS)
        ):
            return base
    return None


# The suffixes pins/sets.toml's [platform.ARCH] tables give twins (halo.pins.inputs).
PLATFORM_TWINS = ("arm64",)


def twin_preferences(
    reference: Lock | None, own: Lock | None, upgrade: Upgrade = NO_UPGRADE
) -> Preferences:
    """A twin prefers the versions its reference set (the amd64 lock) pins, then its own:
    a platform resolves to the same stack wherever the index lets it."""
    first, second = preferences(reference, upgrade), preferences(own, upgrade)
    named = {n for n, _ in first.pins}
    pins = first.pins + tuple(p for p in second.pins if p[0] not in named)
    return Preferences(pins=tuple(sorted(pins)), upgrade=upgrade)


def render(
    inputs: SetInputs,
    pins_dir: Path,
    resolver: Resolver,
    upgrade: Upgrade = NO_UPGRADE,
    previous: Lock | None = None,
    prefer: Preferences | None = None,
) -> str:
    wanted = prefer if prefer is not None else preferences(previous, upgrade)
    resolution = resolver.resolve(inputs, pins_dir, wanted)
    lock = build_lock(inputs, resolution, file_size, previous)
    text = render_lock(lock, lock_header(inputs))
    parse_lock(text, f"{lock_name(inputs.name)} (as rendered)")  # never write what we cannot read
    return text


def resolve_all(
    pins_dir: Path, names: list[str], resolver: Resolver, upgrade: Upgrade = NO_UPGRADE
) -> dict[str, str]:
    """Rendered locks of the named sets (all by default), resolved in parallel: uv mostly waits."""
    every = load_inputs(pins_dir)
    selected = every.select(names)
    # --upgrade takes nothing from the committed locks, not even their files.
    previous = {s.name: None if upgrade.all else committed_lock(pins_dir, s.name) for s in selected}
    prefer: dict[str, Preferences | None] = {}
    for s in selected:
        base = twin_of(every, s.name)
        reference = None if base is None or upgrade.all else committed_lock(pins_dir, base)
        prefer[s.name] = (
            None if base is None else twin_preferences(reference, previous[s.name], upgrade)
        )
    if unknown := upgrade.unknown(previous.values()):
        sets = ", ".join(previous)
        raise HaloError(
            f"--upgrade-package {unknown[0]}: no package of that name in the locks of {sets}"
        )
    with ThreadPoolExecutor(max_workers=max(1, len(selected))) as pool:
        texts = list(
            pool.map(
                lambda s: render(s, pins_dir, resolver, upgrade, previous[s.name], prefer[s.name]),
                selected,
            )
        )
    return {s.name: t for s, t in zip(selected, texts, strict=True)}


def write_locks(
    pins_dir: Path, names: list[str], resolver: Resolver, upgrade: Upgrade = NO_UPGRADE
) -> dict[str, bool]:
    """Resolve every named set first, then write: a failure leaves every lock untouched.

    Returns {set: whether its lock changed}.
    """
    from halo.atomic import write_text

    texts = resolve_all(pins_dir, names, resolver, upgrade)
    changed = {}
    for name, text in texts.items():
        path = lock_path(pins_dir, name)
        changed[name] = not path.is_file() or path.read_text() != text
        if changed[name]:
            write_text(path, text)
            path.chmod(0o644)  # a committed file, readable like the rest of the checkout
    return changed


def check_locks(
    pins_dir: Path, names: list[str], resolver: Resolver, upgrade: Upgrade = NO_UPGRADE
) -> dict[str, str]:
    """{set: unified diff} for every named set whose committed lock differs from a re-lock.

    The re-lock prefers the committed pins, so only inputs that the lock no longer satisfies
    (or an upgrade asked for) show as drift, never a newer file on the index.
    """
    drift = {}
    for name, text in resolve_all(pins_dir, names, resolver, upgrade).items():
        path = lock_path(pins_dir, name)
        old = path.read_text() if path.is_file() else ""
        if old != text:
            drift[name] = "".join(
                difflib.unified_diff(
                    old.splitlines(keepends=True),
                    text.splitlines(keepends=True),
                    fromfile=f"pins/{lock_name(name)} (committed)",
                    tofile=f"pins/{lock_name(name)} (re-locked)",
                )
            )
    return drift
