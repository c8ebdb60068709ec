"""A small reader of the dynamic section of ELF files: what the loader reads, nothing more.

Reads ELF64 little-endian objects (x86_64 and the like) through their program headers, as
ld.so does: PT_DYNAMIC for the entries, PT_LOAD to map DT_STRTAB's address to a file offset.
No binutils needed. Anything else (32-bit, big-endian, truncated) raises ElfError.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1
PT_LOAD = 1
PT_DYNAMIC = 2
DT_NULL = 0
DT_NEEDED = 1
DT_STRTAB = 5
DT_STRSZ = 10
DT_SONAME = 14
DT_RPATH = 15
DT_RUNPATH = 29
EM_X86_64 = 62

_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_DYN = struct.Struct("<qQ")


class ElfError(ValueError):
    """Not an ELF object this reader understands; the message says why."""


@dataclass(frozen=True)
class Dynamic:
    """The dynamic-linking facts of one object."""

    machine: int
    needed: tuple[str, ...]
    soname: str | None
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]

    @property
    def is_dynamic(self) -> bool:
        return bool(self.needed or self.soname or self.rpath or self.runpath)


def is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(4) == MAGIC
    except OSError:
        return False


def _cstr(table: bytes, offset: int) -> str:
    end = table.find(b"\0", offset)
    if offset >= len(table) or end < 0:
        raise ElfError(f"string offset {offset} outside the string table")
    return table[offset:end].decode("utf-8", errors="replace")


def parse(data: bytes | mmap.mmap) -> Dynamic:
    """The dynamic section of an ELF image held in memory."""
    if len(data) < _HEADER.size or data[:4] != MAGIC:
        raise ElfError("not an ELF file")
    if data[4] != ELFCLASS64 or data[5] != ELFDATA2LSB:
        raise ElfError("not a 64-bit little-endian ELF file")
    (_, _, machine, _, _, phoff, _, _, _, phentsize, phnum, _, _, _) = _HEADER.unpack_from(data)
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic: tuple[int, int] | None = None
    for i in range(phnum):
        at = phoff + i * phentsize
        if at + _PHDR.size > len(data):
            raise ElfError("program headers run past the end of the file")
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = _PHDR.unpack_from(data, at)
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None or dynamic[1] == 0:
        # Static, or a separate debug-info file (its PT_DYNAMIC has no bytes in the file):
        # nothing the loader resolves.
        return Dynamic(machine, (), None, (), ())

    entries: list[tuple[int, int]] = []
    offset, size = dynamic
    for at in range(offset, min(offset + size, len(data) - _DYN.size + 1), _DYN.size):
        tag, value = _DYN.unpack_from(data, at)
        if tag == DT_NULL:
            break
        entries.append((tag, value))
    strtab = next((v for t, v in entries if t == DT_STRTAB), None)
    strsz = next((v for t, v in entries if t == DT_STRSZ), None)
    if strtab is None or strsz is None:
        raise ElfError("dynamic section without a string table")
    file_at = next((off + strtab - va for va, off, sz in loads if va <= strtab < va + sz), None)
    if file_at is None:
        raise ElfError("DT_STRTAB is not inside any loaded segment")
    table = bytes(data[file_at : file_at + strsz])

    def strings(tag: int) -> list[str]:
        return [_cstr(table, v) for t, v in entries if t == tag]

    def paths(tag: int) -> tuple[str, ...]:
        return tuple(d for s in strings(tag) for d in s.split(":") if d)

    sonames = strings(DT_SONAME)
    return Dynamic(
        machine=machine,
        needed=tuple(strings(DT_NEEDED)),
        soname=sonames[0] if sonames else None,
        rpath=paths(DT_RPATH),
        runpath=paths(DT_RUNPATH),
    )


def read(path: Path) -> Dynamic:
    """Only the headers and tables are paged in: CUDA libraries run to gigabytes."""
    try:
        with path.open("rb") as fh:
            if fh.seek(0, 2) < _HEADER.size:
                raise ElfError("not an ELF file")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return parse(data)
    except ElfError as exc:
        raise ElfError(f"{path}: {exc}") from None
