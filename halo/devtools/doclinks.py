"""`halo docs check`: every relative link in the README and docs/ points at a file that exists,
and every `#anchor` at a heading that exists (GitHub's slugs), offline.

External links (http, https, mailto) are only checked for form: CI has no business failing
because some web site is down.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from halo.schema import read_text

_LINK = re.compile(r"(?<!\\)\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HTML_ID = re.compile(r"""<a\s+(?:name|id)=["']([^"']+)["']""")
_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_EXTERNAL = ("http://", "https://", "mailto:")


@dataclass(frozen=True)
class Broken:
    file: Path
    line: int
    target: str
    why: str


def doc_files(repo: Path) -> list[Path]:
    """README.md at the top, everything under docs/, and the READMEs of top-level folders."""
    files = [repo / "README.md"] if (repo / "README.md").is_file() else []
    if (repo / "docs").is_dir():
        files += sorted((repo / "docs").rglob("*.md"))
    files += sorted(p for p in repo.glob("*/README.md") if p.parent.name != "docs")
    return files


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """Lines outside fenced code blocks, with inline code blanked."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, re.sub(r"`+[^`]*`+", "", line)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[`*_~]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    for _, line in _prose_lines(text):
        found.update(_HTML_ID.findall(line))
        m = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = counts.get(base, 0)
        counts[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def check_file(path: Path, repo: Path) -> list[Broken]:
    text = read_text(path)
    broken = []
    for number, line in _prose_lines(text):
        targets = [m.group(1) for m in _LINK.finditer(line)]
        if m := _REF_DEF.match(line):
            targets.append(m.group(1))
        for target in targets:
            if target.startswith(_EXTERNAL):
                parts = urllib.parse.urlsplit(target)
                if target.startswith("http") and not parts.netloc:
                    broken.append(Broken(path, number, target, "not a valid URL"))
                continue
            file_part, _, fragment = target.partition("#")
            try:
                dest = (
                    (path.parent / urllib.parse.unquote(file_part)).resolve() if file_part else path
                )
            except (OSError, RuntimeError):  # a symlink loop: RuntimeError before Python 3.13
                broken.append(Broken(path, number, target, "cannot be resolved (a symlink loop)"))
                continue
            if file_part and not dest.exists():
                broken.append(Broken(path, number, target, "no such file"))
                continue
            if repo.resolve() not in (dest, *dest.parents):
                broken.append(Broken(path, number, target, "points outside the repository"))
                continue
            if fragment and dest.suffix == ".md" and fragment not in anchors(read_text(dest)):
                broken.append(Broken(path, number, target, f"no heading with anchor #{fragment}"))
    return broken


def check(repo: Path) -> tuple[int, list[Broken]]:
    files = doc_files(repo)
    return len(files), [b for f in files for b in check_file(f, repo)]
