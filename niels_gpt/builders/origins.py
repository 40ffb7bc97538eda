"""Origins in a cache: where each document (pretraining) or example (SFT) came from.

Files beside the token files, listed in meta.json's `files` (so `verify` checks their sha256) and described
by meta.json's `origins`:

| file                | contents                                                                      |
|---------------------|-------------------------------------------------------------------------------|
| `<split>_origins.npy` | one row per document of the split, in order: a structured array of fields  |
|                     | input, record, char_start, char_end (sources/origins.py says what each is),   |
|                     | each the narrowest little-endian int (unsigned where none is negative) that   |
|                     | holds the cache's values; no char fields where no document has a range (SFT) |
| `origins.json`      | the inputs: index -> path or URL as meta.json's `source.files` names it, its  |
|                     | sha256 (a dataset: its id, config, split; a URL: the store's version), its kind |
|                     | and what its `record` counts                                                  |

Every executor writes the same bytes: the one-process builders note each admitted document's origin as they
admit it, the commit of a parallel build notes the origins its tasks wrote beside their tokens
(`<id>.origins.npy` parts, the task's piece index in the input column, mapped here to the plan's input).
A document cut by a budget keeps the origin of the whole document (meta.json's `cuts` says how many of its
tokens were kept). A dataset shard's record is `shard << 40 | row`.
"""

from __future__ import annotations

import hashlib
import io
import json
from array import array
from pathlib import Path

import numpy as np

from niels_gpt.atomic import write_bytes_atomic
from niels_gpt.errors import CacheError
from niels_gpt.meta import file_record
from niels_gpt.sources.base import portable
from niels_gpt.sources.records import Piece, _opens_a_document, digest

COLUMNS = ["input", "record", "char_start", "char_end"]
TABLE = "origins.json"
SHARD_SHIFT = 40
RECORD_KIND = {".parquet": "row of the file", ".arrow": "row of the file", ".csv": "line",
               "dataset": "shard << 40 | row of the shard", ".jsonl": "byte offset of the line"}


def split_file(split: str) -> str:
    return f"{split}_origins.npy"


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return "sha256:" + h.hexdigest()


def input_table(inputs: list[str], kinds: list[str], config: str | None = None, split: str = "train") -> list[dict]:
    """One entry per input of the plan: its name (as meta.json's source.files), what identifies its bytes, and
    what an origin's `record` counts in it."""
    out = []
    for name, kind in zip(inputs, kinds or [""] * len(inputs), strict=True):
        if kind == "dataset":
            ident = f"dataset:{name}:{config}:{split}"
        elif "://" in name:
            ident = digest(Piece(item=name, kind=kind))
        else:
            ident = _sha256(name)
        record = RECORD_KIND.get(kind, "0: the whole file")
        if "jsonl" in kind or kind.startswith(".json"):
            record = RECORD_KIND[".jsonl"]
        if kind == ".json" and "://" not in name and _opens_a_document(Path(name)):
            record = "element of the array, from 1"
        out.append({"path": portable(name), "sha256": ident, "kind": kind, "record": record})
    return out


class InputIndex:
    """Task piece -> the plan's input index (and a dataset shard's number in the record)."""

    def __init__(self, inputs: list[str], offset: int = 0):
        self.index = {name: offset + i for i, name in enumerate(inputs)}

    def row(self, pieces: list[dict], origin) -> tuple[int, int, int, int]:
        k, record, a, b = (int(x) for x in origin)
        piece = pieces[k]
        if piece.get("kind") == "dataset" and piece.get("stop", -1) >= 0:
            record |= int(piece["start"]) << SHARD_SHIFT
        return self.index[piece["item"]], record, a, b


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
        records = {}
        rows = {s: np.frombuffer(self.rows[s], dtype=np.int64).reshape(-1, 4) for s in ("train", "val")}
        dtype = compact_dtype(np.concatenate([rows["train"], rows["val"]]))
        for s in ("train", "val"):
            if len(rows[s]) != documents[s]:
                raise CacheError(f"{out}: {len(rows[s])} origins for {documents[s]} {s} documents; report this bug")
            arr = np.zeros(len(rows[s]), dtype=dtype)
            for k, name in enumerate(COLUMNS):
                if name in dtype.names:
                    arr[name] = rows[s][:, k]
            buf = io.BytesIO()
            np.save(buf, arr, allow_pickle=False)
            data = buf.getvalue()
            write_bytes_atomic(out / split_file(s), data)
            records[split_file(s)] = {**file_record(out / split_file(s), None, data=data), "documents": len(arr)}
        data = (json.dumps({"columns": COLUMNS, "inputs": self.table}, sort_keys=True, separators=(",", ":"))
                + "\n").encode()
        write_bytes_atomic(out / TABLE, data)
        records[TABLE] = file_record(out / TABLE, None, data=data)
        return records


def compact_dtype(rows: np.ndarray) -> np.dtype:
    """The narrowest structured dtype that holds `rows` (int64 [n, 4]): each field the narrowest little-endian int
    of its values, unsigned where none is negative; the char fields left out where every document has none (-1)."""
    fields = []
    for k, name in enumerate(COLUMNS):
        col = rows[:, k]
        if k >= 2 and (col == -1).all():
            continue
        lo, hi = (int(col.min()), int(col.max())) if len(col) else (0, 0)
        kinds = ("<u1", "<u2", "<u4", "<u8") if lo >= 0 else ("<i1", "<i2", "<i4", "<i8")
        fields.append((name, next(t for t in kinds if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max)))
    return np.dtype(fields)


def as_rows(arr: np.ndarray) -> np.ndarray:
    """int64 [n, 4] rows of an origins array as written (a field left out: -1)."""
    out = np.full((len(arr), 4), -1, dtype=np.int64)
    for k, name in enumerate(COLUMNS):
        if arr.dtype.names and name in arr.dtype.names:
            out[:, k] = arr[name]
    return out


def origins_meta() -> dict:
    """meta.json's `origins`: where they are (what each field is: sources/origins.py, docs/trace.md)."""
    return {"files": {"train": split_file("train"), "val": split_file("val")}, "inputs": TABLE, "columns": COLUMNS}
