"""A CycloneDX SBOM of the Python environment an image ships, without wall-clock time."""

from __future__ import annotations

import uuid
from importlib import metadata

from halo.pins.lockfile import normalize


def environment_components() -> list[dict[str, object]]:
    seen: dict[str, dict[str, object]] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        key = normalize(name)
        seen[key] = {
            "type": "library",
            "bom-ref": f"pkg:pypi/{key}@{dist.version}",
            "name": name,
            "version": dist.version,
            "purl": f"pkg:pypi/{key}@{dist.version}",
            **(
                {"licenses": [{"license": {"name": lic}}]}
                if (lic := dist.metadata.get("License-Expression"))
                else {}
            ),
        }
    return [seen[k] for k in sorted(seen)]


def sbom(image_ref: str, input_hash: str) -> dict[str, object]:
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        # Derived from the input hash, so the same inputs give the same document.
        "serialNumber": f"urn:uuid:{uuid.UUID(input_hash[:32])}",
        "version": 1,
        "metadata": {
            "component": {"type": "container", "name": image_ref, "version": input_hash[:12]},
            "tools": {"components": [{"type": "application", "name": "halo"}]},
        },
        "components": environment_components(),
    }
