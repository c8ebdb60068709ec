"""What a layer holds, independent of when it was built: the fingerprint of its files.

Two builds of the same inputs write the same files at different times; until every build
is reproducible their layer tars (and so their diff_ids) differ only in mtimes. A layer's
fingerprint hashes, for every entry in path order, its path, type, mode, owner, link target,
device numbers and the sha256 of its bytes, and nothing else, so those two layers compare
equal while any change a container could see does not.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from typing import IO

_CHUNK = 1 << 20


def layer_fingerprint(blob: IO[bytes]) -> str:
    entries = []
    # "r|*": a stream, gzip or plain, read once from the registry's response.
    with tarfile.open(fileobj=blob, mode="r|*") as tar:
        for member in tar:
            data = ""
            if member.isfile():
                src = tar.extractfile(member)
                sha = hashlib.sha256()
                while src is not None and (chunk := src.read(_CHUNK)):
                    sha.update(chunk)
                data = sha.hexdigest()
            entries.append(
                [
                    member.name.removeprefix("./").rstrip("/"),
                    member.type.decode(),
                    member.mode,
                    member.uid,
                    member.gid,
                    member.linkname,
                    member.devmajor,
                    member.devminor,
                    data,
                ]
            )
    entries.sort()
    return hashlib.sha256(json.dumps(entries, separators=(",", ":")).encode()).hexdigest()
