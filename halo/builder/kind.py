"""Which kind of builder compiles derivations: configuration only, never this host's state.

``docker`` (the default): images/builder/Dockerfile on the image's builder base, with
``--network none``, no root and nothing from the host's Python. ``native``: on this host in
network-less namespaces (halo.builder.native; root and the lock's CPython), only when asked
for with ``HALO_BUILDER=native``. The kind is an input of every derivation hash, so it must
not follow what this host happens to have made: the same checkout gives the same hashes on
every host with the same configuration.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from halo.errors import HaloError

BUILDER_VAR = "HALO_BUILDER"
KINDS = ("docker", "native")
DEFAULT_KIND = "docker"


def builder_kind(env: Mapping[str, str] | None = None) -> str:
    """``$HALO_BUILDER`` when set, else docker; anything else is one error line."""
    chosen = (os.environ if env is None else env).get(BUILDER_VAR, "") or DEFAULT_KIND
    if chosen not in KINDS:
        raise HaloError(f"${BUILDER_VAR}: {chosen!r}: expected one of {', '.join(KINDS)}")
    return chosen
