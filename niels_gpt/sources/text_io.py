"""Local files read the one way: strictly UTF-8 (a bad byte named by file, offset, line and likely encoding),
BOM and CRLF normalised; directories listed in one order on every machine. The two kinds of record that are
not a plain row: a whole text file, and a record that cannot be used."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from niels_gpt.errors import SourceError


@dataclass(frozen=True)
class FileText:
    """The record of a whole-file kind: the file's text, decoded (BOM and CRLF normalised)."""

    text: str


class BadRecord(Exception):
    """One record that cannot be used: `reason` is its count's name in meta.json."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def list_files(directory: str | os.PathLike, suffix: str, what: str) -> list[Path]:
    """Every `*{suffix}` file under `directory` (recursive, dot-files excluded), sorted by relative path."""
    d = Path(directory)
    if not d.is_dir():
        raise SourceError(f"{d}: no such directory ({what}); pass the directory that holds the "
                          f"{suffix} files")
    found = files_under(d, lambda p: p.name.endswith(suffix))
    if not found:
        raise SourceError(f"{d}: no {suffix} files in this directory ({what}); is it the right one?")
    return found


def files_under(directory: Path, keep: Callable[[Path], bool], *, hidden: bool = False) -> list[Path]:
    """The files under `directory` that `keep` accepts (a dangling link too, so that reading it names it):
    recursive, dot-files and dot-directories left out (`hidden`: kept), sorted by relative path (so the order
    is the same on every machine). Every source that takes a directory reads it this way."""
    found = (f for f in directory.rglob("*")
             if not f.is_dir() and (hidden or not any(part.startswith(".") for part in f.relative_to(directory).parts))
             and keep(f))
    return sorted(found, key=lambda f: f.relative_to(directory).as_posix())


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        if e.errno == errno.ELOOP or isinstance(e, FileNotFoundError) and path.is_symlink():
            raise broken_link(path, loop=e.errno == errno.ELOOP) from None
        raise cannot_read(path, e) from e


def broken_link(path: Path, loop: bool) -> SourceError:
    """A symlink that names no file: one that loops back on itself, or one whose target is missing."""
    what = ("a symlink that loops back on itself, so it names no file" if loop
            else f"a symlink to nothing (its target {os.readlink(path)} is missing)")
    return SourceError(f"{path}: {what}; remove it or point it at the file it stands for")


def cannot_read(path: Path | str, e: OSError) -> SourceError:
    return SourceError(f"{path}: cannot read this file ({e.strerror or e}); check that it exists and is readable")


def decode_utf8(data: bytes, path: Path, record: str | None = None) -> str:
    """Strict UTF-8 with the failing byte offset and line in the error."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise invalid_utf8_error(path, e.start, line=data.count(b"\n", 0, e.start) + 1,
                                 record=record, reason=e.reason) from e


def invalid_utf8_error(path: Path | str, offset: int, *, line: int | None = None,
                       record: str | None = None, reason: str = "invalid byte") -> SourceError:
    where = f"byte {offset}" + (f", line {line}" if line is not None else "")
    rec = f" ({record})" if record else ""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            bad = f.read(4)
    except OSError:
        bad = b""
    return SourceError(f"{path}: invalid UTF-8 at {where}{rec}: {reason}; {bytes_hint(bad)}")


def bytes_hint(bad: bytes) -> str:
    """What the bytes a UTF-8 decode stopped at look like, and how to re-encode them: 0x80-0x9f are printable
    only in cp1252 (latin-1 has control codes there), 0xa0-0xff read the same in both."""
    if not bad:
        return "re-encode the file as UTF-8"
    shown = " ".join(f"0x{b:02x}" for b in bad[:4])
    first = bad[0]
    if first == 0xED and len(bad) >= 3 and 0xA0 <= bad[1] <= 0xBF and 0x80 <= bad[2] <= 0xBF:
        return (f"the bytes are {shown}; 0x{bad[0]:02x} 0x{bad[1]:02x} 0x{bad[2]:02x} is a lone UTF-16 surrogate "
                "written as if it were a character (CESU-8 / WTF-8, as Java or JavaScript strings cut in half write "
                "it), which no UTF-8 text can hold: fix the program that wrote it, or replace these bytes")
    if 0x80 <= first <= 0x9F:
        char = bad[:1].decode("cp1252", errors="replace")
        return (f"the bytes are {shown}; 0x{first:02x} is {char!r} in cp1252 (Windows-1252) and a control code in "
                "latin-1, so the file is most likely cp1252: `iconv -f cp1252 -t utf-8`")
    if first >= 0xA0:
        char = bad[:1].decode("latin-1")
        return (f"the bytes are {shown}; 0x{first:02x} is {char!r} in both cp1252 and latin-1 (ISO-8859-1): "
                "re-encode with `iconv -f cp1252 -t utf-8` (or -f latin1; they agree on this byte)")
    return f"the bytes are {shown}; re-encode the file as UTF-8"


def normalise_text(text: str) -> str:
    """The light normalisation every file source applies: drop a leading BOM, CRLF/CR -> LF."""
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def read_text_file(path: Path) -> str:
    return normalise_text(decode_utf8(read_bytes(path), path))
