"""The two kinds of record that are not a plain row: a whole text file, and a record that cannot be used."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FileText:
    """The record of a whole-file kind: the file's text, decoded (BOM and CRLF normalised)."""

    text: str


class BadRecord(Exception):
    """One record that cannot be used: `reason` is its count's name in meta.json."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
