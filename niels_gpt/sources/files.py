"""Directory sources split by file: Roam Research markdown exports and Project Gutenberg books.

- roam: every `*.md` file under the directory (recursively; dot-files excluded) is one document, its
  text as written (BOM dropped, CRLF -> LF). Whitespace-only notes are skipped ("empty_document").
- gutenberg: every book in a `*.txt` file is one document (a file usually holds one; a file that holds
  several, each with its own `*** START OF` / `*** END OF` pair, gives one document per book). The licence
  header (up to and including the `*** START OF ...` line) and footer (from the `*** END OF ...` line, and
  the "End of the Project Gutenberg EBook of ..." line just before it) are cut off, BOM and CRLF are
  normalised, and the body is stripped of surrounding whitespace. Credit lines such as "Produced by ..."
  stay (light touch). A file without both markers, or with a second START before the first END, is an
  error naming the line: it is not a Gutenberg book, or its licence text was cut some other way.
- the split is by file (`base.FILE_SPLIT_RULE`): a seeded torch permutation of the sorted relative file
  names, val_frac 0.1. The file list is taken when the source is made; one file is read at a time.
Cost: 28 MB/s for the 10 Gutenberg books of ../shared/data (tools/measure_sources.py).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from niels_gpt.constants import SEED
from niels_gpt.errors import SourceError
from niels_gpt.sources.base import (
    FILE_SPLIT_RULE,
    VAL_FRAC,
    TextSource,
    check_val_frac,
    portable,
    split_by_file,
)
from niels_gpt.sources.text_io import files_under, list_files, read_text_file

GUTENBERG_START = re.compile(r"^\*\*\*\s*START OF\b.*$", re.MULTILINE | re.IGNORECASE)
GUTENBERG_END = re.compile(r"^\*\*\*\s*END OF\b", re.MULTILINE | re.IGNORECASE)
# "End of the Project Gutenberg EBook of <title>, by <author>", often wrapped over two lines, just
# before the END marker: licence boilerplate too. Looked for only in the body's last TAIL_CHARS.
GUTENBERG_END_LINE = re.compile(r"^End of (the )?Project Gutenberg", re.MULTILINE | re.IGNORECASE)
TAIL_CHARS = 400


class FileSplitSource(TextSource):
    """One document per file, split into train/val by a seeded permutation of the file list."""

    own_split = True
    streaming = False
    split_rule = FILE_SPLIT_RULE
    suffix = ""

    def __init__(self, directory: str | os.PathLike, *, val_frac: float, seed: int):
        super().__init__()
        check_val_frac(val_frac, self.name)
        self.directory = Path(directory)
        self.paths = list_files(self.directory, self.suffix, self.name)
        self.left_out = self._left_out()
        self.names = [p.relative_to(self.directory).as_posix() for p in self.paths]
        self.val_frac = val_frac
        self.seed = seed
        self.split_index = split_by_file(self.names, val_frac, seed)

    def files(self) -> list[str]:
        return list(self.names)

    def input_paths(self) -> list[Path]:
        return list(self.paths)

    def split_files(self, split: str) -> list[str]:
        """The relative file names of one split, in sorted order."""
        return [self.names[i] for i in self.split_index[split]]

    def _iter_split(self, split: str | None) -> Iterator[str]:
        for s in (["train", "val"] if split is None else [split]):
            for i in self.split_index[s]:
                for text in self.documents(self.paths[i]):
                    if not text.strip():
                        self.skipped["empty_document"] += 1
                        continue
                    yield text

    def documents(self, path: Path) -> list[str]:
        """The documents one file holds (one, for most sources)."""
        return [read_text_file(path)]

    def _left_out(self) -> list[dict]:
        """The other files under the directory, each with why it is not read (meta.json's skipped_inputs)."""
        read = set(self.paths)
        out = []
        for f in files_under(self.directory, lambda f: f not in read, hidden=True):
            rel = f.relative_to(self.directory)
            why = ("a hidden file (its name starts with a dot)" if any(p.startswith(".") for p in rel.parts)
                   else f"{self.name} reads only {self.suffix} files; to read it, build it with `build FILE "
                        "--format text` (or --read-as SUFFIX=text)")
            out.append({"path": portable(f), "reason": why})
        return out

    def _describe_extra(self) -> dict[str, Any]:
        return {"directory": portable(self.directory), "val_frac": self.val_frac, "seed": self.seed,
                "val_files": self.split_files("val"),
                **({"skipped_inputs": self.left_out} if self.left_out else {})}


class Roam(FileSplitSource):
    name = "roam"
    suffix = ".md"


class Gutenberg(FileSplitSource):
    name = "gutenberg"
    suffix = ".txt"

    def documents(self, path: Path) -> list[str]:
        return gutenberg_books(read_text_file(path), path)


READ_AS_TEXT = ("To read it anyway as plain text, licence included, build it with `build FILE --format text`, or "
                "add the missing line")


def gutenberg_books(text: str, path: Path | str = "<text>", *, as_text: str = READ_AS_TEXT) -> list[str]:
    """Every book of a Project Gutenberg file: the text between each `*** START OF` line and the
    `*** END OF` line after it, licence lines cut, whitespace-stripped. `as_text`: how the refusal of a
    file cut before its END line says to read it anyway."""
    books, pos = [], 0
    while (start := GUTENBERG_START.search(text, pos)) is not None:
        end = GUTENBERG_END.search(text, start.end())
        if end is None:
            raise SourceError(f"{path}: a '*** START OF' line but no '*** END OF ...' line after it (the START is "
                              f"line {_line(text, start.start())}), so the licence footer cannot be cut off; is the "
                              f"file truncated? {as_text}")
        second = GUTENBERG_START.search(text, start.end(), end.start())
        if second is not None:
            raise SourceError(f"{path}: a second '*** START OF' line (line {_line(text, second.start())}) before "
                              f"the first book's '*** END OF' line (line {_line(text, end.start())}); each book "
                              "needs its own START/END pair: fix the markers or split the file into one book each")
        body = text[start.end():end.start()].rstrip()
        ends = list(GUTENBERG_END_LINE.finditer(body, max(len(body) - TAIL_CHARS, 0)))
        if ends:
            body = body[:ends[-1].start()]
        books.append(body.strip())
        pos = end.end()
    if not books:
        raise SourceError(f"{path}: no '*** START OF ...' line, so the Project Gutenberg licence header "
                          "cannot be cut off; remove this file from the gutenberg directory or cut the "
                          "header by hand")
    return books


def strip_gutenberg(text: str, path: Path | str = "<text>") -> str:
    """The one book of a Project Gutenberg file (see `gutenberg_books`); a file of several is refused here,
    naming how many: read it with `gutenberg_books`."""
    books = gutenberg_books(text, path)
    if len(books) > 1:
        raise SourceError(f"{path}: holds {len(books)} books (a '*** START OF' / '*** END OF' pair each); "
                          "strip_gutenberg returns one: use niels_gpt.sources.files.gutenberg_books for all of them")
    return books[0]


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def roam(directory: str | os.PathLike, *, val_frac: float = VAL_FRAC, seed: int = SEED) -> Roam:
    """A Roam Research markdown export: one document per .md file, split by file (seeded)."""
    return Roam(directory, val_frac=val_frac, seed=seed)


def gutenberg(directory: str | os.PathLike, *, val_frac: float = VAL_FRAC, seed: int = SEED) -> Gutenberg:
    """Project Gutenberg .txt books: licence header/footer cut, split by book (seeded)."""
    return Gutenberg(directory, val_frac=val_frac, seed=seed)
