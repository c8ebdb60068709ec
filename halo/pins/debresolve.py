"""Resolve a base's Debian closure: mmdebstrap decides, the archive's index describes.

mmdebstrap itself resolves (the same apt solver, Essential set and variant rules that make
the base), into no output (`--format=null`); a customize hook records what dpkg installed
and copies apt's `Packages` lists out, which apt verified against the signed Release. Each
installed package's record there gives the lock its filename, size and sha256.

Resolution needs the network; nothing else in halo.pins does. Locking is stable: a committed
lock whose inputs still match the catalog and whose invariants hold is kept as it is (the
archive drops superseded versions, so re-resolving would move every lock with each point
release); `--upgrade` resolves again on purpose.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from halo.errors import HaloError
from halo.pins.deblock import Deb, DebInputs, DebLock
from halo.report import say

FIELDS = ("Package", "Version", "Architecture", "Filename", "Size", "SHA256")


def paragraphs(text: str) -> Iterator[dict[str, str]]:
    """The stanzas of a Debian control file (a `Packages` index); continuation lines dropped
    (no field the lock keeps spans lines)."""
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        if fields:
            yield fields


def lock_from_index(
    inputs: DebInputs, installed: set[tuple[str, str, str]], packages_text: str
) -> DebLock:
    """The lock of ``installed`` (name, version, architecture) from the archive's index text."""
    found: dict[tuple[str, str, str], Deb] = {}
    essential = set()
    for p in paragraphs(packages_text):
        if p.get("Essential") == "yes" and p.get("Architecture") in ("all", inputs.architecture):
            essential.add(p["Package"])
        key = (p.get("Package", ""), p.get("Version", ""), p.get("Architecture", ""))
        if key not in installed:
            continue
        missing = [f for f in FIELDS if not p.get(f)]
        if missing:
            raise HaloError(f"archive index: {key[0]} {key[1]}: no {', '.join(missing)} field")
        found[key] = Deb(
            name=key[0],
            version=key[1],
            architecture=key[2],
            filename=p["Filename"],
            size=int(p["Size"]),
            sha256=p["SHA256"],
            depends=p.get("Depends", ""),
            pre_depends=p.get("Pre-Depends", ""),
            provides=p.get("Provides", ""),
            essential=p.get("Essential") == "yes",
        )
    absent = sorted(installed - set(found))
    if absent:
        shown = ", ".join(f"{n} {v}" for n, v, _ in absent[:5])
        raise HaloError(f"base {inputs.base}: installed but not in the archive's index: {shown}")
    return DebLock(inputs, tuple(sorted(essential)), tuple(found[k] for k in sorted(found)))


def resolve(inputs: DebInputs, mirror: str, workdir: Path | None = None) -> DebLock:
    """Run mmdebstrap against ``mirror`` (network) and lock what it installed."""
    with tempfile.TemporaryDirectory(dir=workdir, prefix="deb-resolve.") as tmp:
        out = Path(tmp)
        q = shlex.quote(str(out))
        fmt = r"${Package}\t${Version}\t${Architecture}\n"
        argv = [
            "mmdebstrap",
            f"--variant={inputs.variant}",
            f"--architectures={inputs.architecture}",
            f"--components={inputs.component}",
            "--format=null",
            f"--customize-hook=chroot \"$1\" dpkg-query -W -f '{fmt}' > {q}/installed.tsv",
            f'--customize-hook=cat "$1"/var/lib/apt/lists/*_Packages > {q}/Packages',
        ]
        if inputs.packages:
            argv.append(f"--include={','.join(sorted(inputs.packages))}")
        argv += [inputs.suite, "/dev/null", f"deb {mirror} {inputs.suite} {inputs.component}"]
        say(
            f"resolve {inputs.base}: mmdebstrap {inputs.suite} +{','.join(sorted(inputs.packages))}"
        )
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=os.environ)
        except FileNotFoundError:
            raise HaloError(
                "mmdebstrap: not found; install Debian's mmdebstrap to lock a base"
            ) from None
        if proc.returncode != 0:
            tail = proc.stderr.strip().splitlines()[-3:]
            raise HaloError(f"base {inputs.base}: resolution failed: {' | '.join(tail)}")
        installed = set()
        for line in (out / "installed.tsv").read_text().splitlines():
            name, version, arch = line.split("\t")
            installed.add((name, version, arch))
        return lock_from_index(inputs, installed, (out / "Packages").read_text())
