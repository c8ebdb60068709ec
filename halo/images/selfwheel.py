"""Build halo's own wheel deterministically, with no build backend and no network.

The image build is offline, so halo cannot be built inside it by a PEP 517 backend fetched
from an index. A wheel is a zip with a dist-info folder; writing it here with fixed
timestamps and sorted entries makes it a pure function of the source tree.
"""

from __future__ import annotations

import base64
import hashlib
import tomllib
import zipfile
from pathlib import Path

from halo import __version__
from halo.hashing import tree_files

ZIP_EPOCH = (2026, 11, 1, 0, 0, 0)


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _metadata(repo: Path) -> tuple[str, str, dict[str, str]]:
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {__version__}",
        f"Summary: {project.get('description', '')}",
        f"Requires-Python: {project.get('requires-python', '')}",
        *(f"Requires-Dist: {dep}" for dep in project.get("dependencies", [])),
    ]
    return project["name"], "\n".join(lines) + "\n", project.get("scripts", {})


def wheel_name(repo: Path) -> str:
    name, _, _ = _metadata(repo)
    return f"{name.replace('-', '_')}-{__version__}-py3-none-any.whl"


def build_wheel(repo: Path, out_dir: Path) -> Path:
    name, metadata, scripts = _metadata(repo)
    dist_info = f"{name.replace('-', '_')}-{__version__}.dist-info"
    files: list[tuple[str, bytes]] = [
        (path.relative_to(repo).as_posix(), path.read_bytes()) for path in tree_files(repo / "halo")
    ]
    files.append((f"{dist_info}/METADATA", metadata.encode()))
    files.append(
        (
            f"{dist_info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: halo\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
    )
    if scripts:
        entry = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(scripts.items()))
        files.append((f"{dist_info}/entry_points.txt", entry.encode()))
    record = (
        "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in files) + f"{dist_info}/RECORD,,\n"
    )
    files.append((f"{dist_info}/RECORD", record.encode()))
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / wheel_name(repo)
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in files:
            info = zipfile.ZipInfo(arcname, date_time=ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return out
