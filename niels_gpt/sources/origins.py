"""Where each document or conversation of a task's stream came from: its origin.

An origin is four integers (what a cache stores per document, builders/origins.py):

| field        | what                                                                                        |
|--------------|---------------------------------------------------------------------------------------------|
| `input`      | the input (the index of its piece in the task here; of the plan's inputs in a cache)        |
| `record`     | JSON Lines: the byte offset of the record's line in the (decompressed) file; Parquet and     |
|              | Arrow: the row in the file (counted over every row group or record batch); CSV: the line;   |
|              | a dataset shard: the row in the shard; a `.json` array: the element (from 1); a text file: 0 |
| `char_start` | the document's first character in the record's text after the text rules (BOM dropped,     |
| `char_end`   | CRLF as LF; a whole file: its text): [start, end). A Gutenberg book is its text between the   |
|              | licence lines, a --val-per-input piece its piece, a wikitext article runs from its heading;  |
|              | -1 where the text is not a run of the record's (a --map hook's output, wikitext's end, a    |
|              | conversation: the record is the whole of it)                                                |

An OpenAssistant conversation's record is its tree: the line of a tree export, the first row of a tree of
flat message rows. Cost: one attribute read per record and one `str.find` per document, which matches at
the position it starts from (bench/bench_origins.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from niels_gpt.sources.records_base import FileText
from niels_gpt.sources.text_io import normalise_text
from niels_gpt.sources.wikitext import is_article_heading

UNKNOWN = -1


def record_position(where: Any) -> int:
    """The record's position (module table) from its `where`: a JSON Lines line carries its byte offset;
    others end in ", row N", ", line N" or ", record N"; a whole file is 0."""
    offset = getattr(where, "offset", None)
    if offset is not None:
        return int(offset)
    head, _, tail = str(where).rpartition(" ")
    if tail.isdigit() and head.endswith((", row", ", line", ", record")):
        return int(tail)
    return 0


class Reading:
    """The record a task's layout read last (and, for OpenAssistant flat rows, the first row of each tree)."""

    __slots__ = ("k", "where", "record", "group", "previous", "tree", "exhausted", "headings")

    def __init__(self):
        self.k, self.where, self.record = 0, None, None
        self.group = self.previous = (0, None, None)
        self.tree = None
        self.exhausted = False
        self.headings = None  # wikitext line rows: the text field, whose article headings start groups

    def read(self, k: int, where, record) -> None:
        self.k, self.where, self.record = k, where, record
        if isinstance(record, dict):
            if "message_tree_id" in record and record.get("message_tree_id") != self.tree:
                self.tree = record.get("message_tree_id")
                self.previous, self.group = self.group, (k, where, record)
            elif self.headings is not None and is_article_heading(record.get(self.headings) or ""):
                self.previous, self.group = self.group, (k, where, record)


def _text_of(record, rules) -> str | None:
    if isinstance(record, FileText):
        return record.text
    if isinstance(record, dict):
        value = record.get(rules.text_field)
        if isinstance(value, str):
            if value.startswith("\ufeff") or "\r" in value:
                value = normalise_text(value)
            return value
    return None


def _find(text: str, item: str, end: int) -> int:
    """Where `item` starts in `text` at or after `end`, or -1: its first characters found, then the whole
    compared in place (a whole-needle str.find of a 1 MB book costs ~1 ms; this ~the distance searched)."""
    start = text.find(item[:256], end)
    if start >= 0 and text.startswith(item, start):
        return start
    return text.find(item, end) if start >= 0 else -1


def located(out, at: Reading, layout: str, rules) -> Iterator[tuple[Any, tuple | None]]:
    """(item, origin) for each item of a layout's output `out` while `at` follows the records it reads."""
    last_where, end = None, 0
    if layout == "wikitext":
        at.headings = rules.text_field
    for item in out:
        if not isinstance(item, (str, list)):  # a Skipped
            yield item, None
            continue
        if layout == "oasst-rows":  # a tree is yielded once the next tree's first row (or the end) is read
            k, where, _ = at.group if at.exhausted else at.previous
            yield item, (k, record_position(where), UNKNOWN, UNKNOWN)
            continue
        if layout == "wikitext" and isinstance(at.record, dict):  # line rows: the article's heading row
            k, where, row = at.group if at.exhausted else at.previous
            first = item.split("\n", 1)[0]
            yield item, (k, record_position(where), (row.get(rules.text_field) or "").find(first), UNKNOWN)
            continue
        k, where = at.k, at.where
        if not isinstance(item, str):
            yield item, (k, record_position(where), UNKNOWN, UNKNOWN)
            continue
        if where is not last_where:
            last_where, end = where, 0
        text = _text_of(at.record, rules)
        start = UNKNOWN
        if text is not None:
            if layout == "wikitext":
                first = item.split("\n", 1)[0]
                start = text.find(first, end)
                if start >= 0:
                    end = start + len(first)
                yield item, (k, record_position(where), start, UNKNOWN)
                continue
            start = 0 if text is item else _find(text, item, end)
        if start < 0:
            yield item, (k, record_position(where), UNKNOWN, UNKNOWN)
            continue
        end = start + len(item)
        yield item, (k, record_position(where), start, end)
