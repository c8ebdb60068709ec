"""Which binary cache (if any) this host uses, and what it trusts: configuration only.

``HALO_CACHE``            HOST[:PORT][/PREFIX] of the registry that holds the cache (the
                          images' registry; ``$HALO_REGISTRY`` when unset), or ``off``
``HALO_CACHE_SIGNERS``    an OpenSSH allowed-signers file: entries signed by one of these
                          keys are trusted (``ssh-keygen -Y verify``, namespace halo-cache)
``HALO_CACHE_PINNED``     a TOML file ``[derivations] "<derivation hash>" = "<wheel sha256>"``:
                          entries whose wheel has the pinned digest are trusted
``HALO_CACHE_SIGNING_KEY``  the private key `halo cache push` signs with (CI only)

An entry is used only when its recorded output hash matches its wheel's bytes *and* a
signature or a pinned digest vouches for that hash; with neither configured, nothing is
pulled (the cache is refused, loudly).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from halo.cache.oci import RegistryCache

CACHE_VAR = "HALO_CACHE"
SIGNERS_VAR = "HALO_CACHE_SIGNERS"
PINNED_VAR = "HALO_CACHE_PINNED"
KEY_VAR = "HALO_CACHE_SIGNING_KEY"


def cache_registry(env: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    value = env.get(CACHE_VAR) or env.get("HALO_REGISTRY") or ""
    return None if value in ("", "off") else value.rstrip("/")


def configured_cache(env: Mapping[str, str] | None = None) -> RegistryCache | None:
    env = os.environ if env is None else env
    registry = cache_registry(env)
    if registry is None:
        return None
    from halo.cache.oci import RegistryCache
    from halo.cache.trust import Trust

    signers = env.get(SIGNERS_VAR)
    pinned = env.get(PINNED_VAR)
    trust = Trust(
        signers=Path(signers) if signers else None,
        pinned=Path(pinned) if pinned else None,
    )
    key = env.get(KEY_VAR)
    return RegistryCache(registry, trust, signing_key=Path(key) if key else None)
