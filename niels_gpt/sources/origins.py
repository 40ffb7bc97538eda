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

import io
import json
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from niels_gpt.atomic import write_bytes_atomic
from niels_gpt.errors import CacheError
from niels_gpt.meta import file_record
from niels_gpt.sources.layouts import is_article_heading
from niels_gpt.sources.text_io import FileText, normalise_text

UNKNOWN = -1
COLUMNS = ["input", "record", "char_start", "char_end"]
FILE = "origins.npy"
TABLE = "origins.json"
RECORD_KIND = {".parquet": "row of the file", ".arrow": "row of the file", ".csv": "line",
               "dataset": "shard << 40 | row of the shard", ".jsonl": "byte offset of the line"}


def record_position(where: Any) -> int:
    """The record's position (module table) from its `where`: a JSON Lines line's offset, the N of
    ", row N", ", line N" or ", record N", else 0 (a whole file)."""
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
            return normalise_text(value)  # the same str when it needs no change (located's `text is item`)
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
        # oasst-rows: a tree is yielded once the next tree's first row (or the end) is read; wikitext line
        # rows: an article once the next heading row is; its origin is that group's first row
        if layout == "oasst-rows" or (layout == "wikitext" and isinstance(at.record, dict)):
            k, where, row = at.group if at.exhausted else at.previous
            start = UNKNOWN if layout == "oasst-rows" else (row.get(rules.text_field) or "").find(item.split("\n", 1)[0])
            yield item, (k, record_position(where), start, UNKNOWN)
            continue
        if at.where is not last_where:
            last_where, end = at.where, 0
        text = _text_of(at.record, rules) if isinstance(item, str) else None
        start = stop = UNKNOWN
        if text is not None and layout == "wikitext":  # an article of a raw file: where its heading is
            first = item.split("\n", 1)[0]
            start = text.find(first, end)
            if start >= 0:
                end = start + len(first)
        elif text is not None:
            start = 0 if text is item else _find(text, item, end)
            if start >= 0:
                end = stop = start + len(item)
        yield item, (at.k, record_position(at.where), start, stop)


# The origin files of a cache (the layout: builders/origins.py)


def _counts(kind: str) -> str:
    """What an origin's `record` counts in an input of `kind` (a `.json` array: see input_table)."""
    if "jsonl" in kind or kind.startswith(".json"):
        return RECORD_KIND[".jsonl"]
    return RECORD_KIND.get(kind, "0: the whole file")


def table_bytes(inputs: list[dict], constant: dict, splits: dict[str, int]) -> bytes:
    """origins.json: each input's `record` said once per kind (`records`), where it is that kind's."""
    records = {e["kind"]: _counts(e["kind"]) for e in inputs}
    entries = [{k: v for k, v in e.items() if k != "record" or v != records[e["kind"]]} for e in inputs]
    doc = {"constant": constant, "inputs": entries, "records": records, "splits": splits}
    return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()


def read_table(data: bytes, where: str) -> dict:
    """origins.json as written by table_bytes, each input with its `record` again; CacheError naming `where`."""
    try:
        doc = json.loads(data.decode("utf-8"))
        records = doc["records"]
        doc["inputs"] = [{**e, "record": e.get("record", records.get(e["kind"], ""))} for e in doc["inputs"]]
        splits = {s: int(n) for s, n in doc["splits"].items()}
        constant = {k: int(v) for k, v in doc["constant"].items() if k in COLUMNS}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CacheError(f"{where}: not an origins table ({type(exc).__name__}: {exc}); rebuild the cache") from exc
    return {**doc, "splits": splits, "constant": constant}


class OriginLog:
    """The origins of the documents admitted to each split, in order."""

    def __init__(self, table: list[dict] | None):
        self.table = table
        self.rows = {"train": array("q"), "val": array("q")}
        self.seen = {"train": 0, "val": 0}

    def note(self, counts: dict[str, int], row) -> None:
        """After one document was offered: `counts` are the splits' document counts now; the split whose
        count grew admitted it."""
        for s in ("val", "train"):
            if counts[s] != self.seen[s]:
                self.seen[s] = counts[s]
                self.rows[s].extend(row)

    def add(self, split: str, row) -> None:
        self.seen[split] += 1
        self.rows[split].extend(row)

    def write(self, out: Path, documents: dict[str, int]) -> dict:
        """Write the origin files into `out`; their meta.json `files` records."""
        rows = {s: np.frombuffer(self.rows[s], dtype=np.int64).reshape(-1, 4) for s in ("train", "val")}
        for s in ("train", "val"):
            if len(rows[s]) != documents[s]:
                raise CacheError(f"{out}: {len(rows[s])} origins for {documents[s]} {s} documents; report this bug")
        both = np.concatenate([rows["train"], rows["val"]])
        constant = constants(both)
        data = npy_bytes(both, compact_dtype(both, constant))
        write_bytes_atomic(out / FILE, data)
        records = {FILE: {**file_record(out / FILE, None, data=data), "documents": len(both)}}
        data = table_bytes(self.table, constant, {s: len(rows[s]) for s in ("train", "val")})
        write_bytes_atomic(out / TABLE, data)
        records[TABLE] = file_record(out / TABLE, None, data=data)
        return records


def constants(rows: np.ndarray) -> dict[str, int]:
    """The fields of `rows` (int64 [n, 4]) that hold one value other than -1 over every row."""
    if not len(rows):
        return {}
    return {name: int(rows[0, k]) for k, name in enumerate(COLUMNS)
            if rows[0, k] != UNKNOWN and (rows[:, k] == rows[0, k]).all()}


def compact_dtype(rows: np.ndarray, constant: dict | None = None) -> np.dtype:
    """The narrowest structured little-endian dtype that holds `rows` (int64 [n, 4]), unsigned where no value
    is negative; char fields -1 everywhere and the fields of `constant` left out."""
    fields = []
    for k, name in enumerate(COLUMNS):
        col = rows[:, k]
        if (k >= 2 and (col == -1).all()) or name in (constant or {}):
            continue
        lo, hi = (int(col.min()), int(col.max())) if len(col) else (0, 0)
        kinds = ("<u1", "<u2", "<u4", "<u8") if lo >= 0 else ("<i1", "<i2", "<i4", "<i8")
        fields.append((name, next(t for t in kinds if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max)))
    return np.dtype(fields)


def npy_bytes(rows: np.ndarray, dtype: np.dtype) -> bytes:
    """`rows` (int64 [n, 4]) as a .npy of the structured `dtype` (its fields only)."""
    arr = np.zeros(len(rows), dtype=dtype)
    for k, name in enumerate(COLUMNS):
        if dtype.names and name in dtype.names:
            arr[name] = rows[:, k]
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def as_rows(arr: np.ndarray, constant: dict | None = None) -> np.ndarray:
    """int64 [n, 4] rows of an origins array as written (a field left out: its value in `constant`, else -1)."""
    out = np.full((len(arr), 4), -1, dtype=np.int64)
    for k, name in enumerate(COLUMNS):
        if arr.dtype.names and name in arr.dtype.names:
            out[:, k] = arr[name]
        elif name in (constant or {}):
            out[:, k] = constant[name]
    return out


def split_rows(arr: np.ndarray, table: dict, split: str) -> np.ndarray:
    """The int64 [n, 4] rows of `split` out of origins.npy's array and origins.json (read_table)."""
    splits = table["splits"]
    first = 0 if split == "train" else splits.get("train", 0)
    return as_rows(arr[first:first + splits.get(split, 0)], table["constant"])


def split_origins(root: Path, meta: dict, split: str) -> tuple[bytes, bytes, int] | None:
    """A split's origins on their own (a converted split's sidecar): (.npy, origins.json, documents), or None."""
    names = meta.get("origins") or {}
    rel, table = names.get("file"), names.get("inputs")
    if rel is None or table is None or not (root / rel).is_file() or not (root / table).is_file():
        return None
    doc = read_table((root / table).read_bytes(), str(root / table))
    rows = split_rows(np.load(root / rel, allow_pickle=False), doc, split)
    return npy_bytes(rows, compact_dtype(rows)), table_bytes(doc["inputs"], {}, {split: len(rows)}), len(rows)


def write_joined(out: Path, parts: dict[str, tuple[bytes, bytes]]) -> dict:
    """Split sidecars (split_origins) joined again into one cache's origin files in `out`; their `files` records."""
    log, counts = OriginLog(None), {}
    for split in ("train", "val"):
        if split in parts:
            rows, table = parts[split]
            log.table = read_table(table, str(out / TABLE))["inputs"]
            for row in as_rows(np.load(io.BytesIO(rows), allow_pickle=False)).tolist():
                log.add(split, row)
        counts[split] = log.seen[split]
    return log.write(out, counts)


def origins_meta() -> dict:
    """meta.json's `origins`: where they are (what each field is: sources/origins.py, docs/trace.md)."""
    return {"file": FILE, "inputs": TABLE}
