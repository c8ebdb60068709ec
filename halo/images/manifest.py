"""What an image ships, by content: path -> sha256 for the Python environment and Halo's files.

Layer digests change with file mtimes, which BuildKit in Debian's engine cannot pin; the
files' bytes are what "same inputs, same outputs" promises. Two builds of one input hash
must give the same manifest (`halo image diff`).
"""

from __future__ import annotations

import json

from halo.errors import HaloError
from halo.images.docker import Docker

ROOTS = ("/opt/venv", "/opt/halo", "/etc/halo")

# Runs inside the image with its own Python; prints one JSON object.
_SCRIPT = """
import hashlib, json, os, sys
out = {}
for root in sys.argv[1:]:
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(d, f)
            if os.path.islink(p):
                out[p] = "link:" + os.readlink(p)
            elif os.path.isfile(p):
                with open(p, "rb") as fh:
                    out[p] = hashlib.sha256(fh.read()).hexdigest()
print(json.dumps(out, sort_keys=True))
"""


def content_manifest(docker: Docker, ref: str) -> dict[str, str]:
    proc = docker.run(
        ["--rm", "--network=none", "--entrypoint", "python3", ref, "-c", _SCRIPT, *ROOTS],
        capture=True,
    )
    if proc.returncode != 0:
        why = " ".join(proc.stderr.split())[-300:]
        raise HaloError(f"{ref}: could not list its files ({why})")
    return json.loads(proc.stdout)


def diff_manifests(left: dict[str, str], right: dict[str, str]) -> list[str]:
    lines = []
    for path in sorted(left.keys() | right.keys()):
        a, b = left.get(path), right.get(path)
        if a == b:
            continue
        if a is None:
            lines.append(f"+ {path}")
        elif b is None:
            lines.append(f"- {path}")
        else:
            lines.append(f"~ {path}")
    return lines
