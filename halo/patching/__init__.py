"""Self-neutralizing patches to upstream packages: the model a patch module declares.

A patch module (one file in patches/) defines ``PATCH = Patch(...)``; the engine in
``halo.patching.engine`` decides per patch whether to apply, skip or fail.
"""

from __future__ import annotations

from halo.patching.model import Edit, Marker, Patch, Result, State

__all__ = ["Edit", "Marker", "Patch", "Result", "State"]
