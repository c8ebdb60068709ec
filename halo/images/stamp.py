"""Runs inside the image build: apply patches strictly, write build.json, check and place the SBOM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated

from pydantic import Field

from halo.atomic import write_text
from halo.errors import HaloError
from halo.images.sbom import SBOM_FILE, check_installed, installed_distributions
from halo.schema import Name, Sha256Hex, Strict, read_text, validate


def apply_patches(site: Path | None = None, patches: Path | None = None) -> dict[str, object]:
    """The patch engine's own CLI, strict: drift fails the build with its one line.

    With ``site`` (an image assembled on the build host, halo.images.realise.assemble): that
    site-packages and ``patches``, in this process; the report names no host path."""
    if site is not None:
        return _apply_to(site, patches)
    proc = subprocess.run(
        [sys.executable, "-m", "halo", "patches", "apply", "--strict", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        raise HaloError(
            f"patches: strict apply failed (exit {proc.returncode}); the image is not built"
        )
    return json.loads(proc.stdout)


def _apply_to(site: Path, patches: Path | None) -> dict[str, object]:
    from halo.patching.engine import drift_lines, plan_all, write_plans
    from halo.patching.loader import load_patches

    plans = plan_all(load_patches(patches) if patches else [], site)
    results = [p.result for p in plans]
    if lines := drift_lines(results):
        raise HaloError(f"patches: strict apply failed: {lines[0]}; the image is not built")
    write_plans(plans)
    return {"mode": "apply", "patches": [r.to_json() for r in results]}


class BuildInputs(Strict):
    """build-inputs.json, as `halo image build` stages it into the context."""

    image: Name
    image_ref: Annotated[str, Field(min_length=1)]
    input_hash: Sha256Hex
    inputs: dict[str, object]
    base_ref: Annotated[str, Field(min_length=1)]
    halo_version: Annotated[str, Field(min_length=1)]


def read_build_inputs(path: Path) -> dict[str, object]:
    text = read_text(path)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise HaloError(f"{path}: not valid JSON ({exc})") from None
    validate(BuildInputs, data, str(path))
    return dict(data)


def stamp(
    inputs_path: Path,
    out: Path,
    sbom_out: Path | None,
    with_patches: bool,
    site: Path | None = None,
    patches: Path | None = None,
) -> dict[str, object]:
    """In the image (``site`` None): this interpreter's packages. Assembling an image on the
    build host: the staged ``site`` and ``patches``, the same record and checks."""
    inputs = read_build_inputs(inputs_path)
    record: dict[str, object] = dict(inputs)
    record["patches"] = apply_patches(site, patches).get("patches", []) if with_patches else []
    write_text(out, json.dumps(record, indent=2, sort_keys=True) + "\n")
    if sbom_out is not None:
        # Made on the host from the lock (halo.images.sbom); here it must match what got in.
        text = read_text(inputs_path.with_name(SBOM_FILE))
        check_installed(json.loads(text), installed_distributions(site))
        write_text(sbom_out, text)
    return record
