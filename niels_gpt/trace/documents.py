"""Where a cache's documents are, and what the cache knows of their origin: `document_origin`.

A pretraining split is its shards back to back, cut into documents at meta.json's `document_separator`;
an SFT split's example i is document i (its offsets); a packed bin's sequences are its documents. The
origin: the cache, split, index, token range and inputs, and where the cache records origins
(builders/origins.py) the document's input, record (`where`: "a.jsonl, line 17") and character range.
`find_document` is the reverse (INPUT:RECORD -> the document). Cost: the first question about a pretraining
split reads it once for its separators (bench/bench_trace.py); an SFT split reads its offsets only.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import numpy as np

from niels_gpt.constants import EXAMPLES_NAME, META_NAME, SPLITS, TOKEN_DTYPES
from niels_gpt.errors import CacheError, CacheMismatchError, ConfigError, NielsGPTError, first_few
from niels_gpt.meta import load_checked_npy, read_meta
from niels_gpt.readers.shards import shard_array, split_shards
from niels_gpt.sources.origins import read_table, split_rows
from niels_gpt.storage.remote import open_location
from niels_gpt.trace.messages import OASST_LAYOUTS, conversation_ids, local_input
from niels_gpt.urls import is_url


class CacheDocuments:
    """The documents of one split of a cache (`cache`: a directory or URL, as the run names it)."""

    def __init__(self, cache: str, split: str):
        self.cache, self.split = str(cache), split
        self.local, self.remote = open_location(self.cache)
        self.meta = read_meta(str(self.local))
        self.kind = self.meta.get("kind")
        self.dtype = np.dtype(TOKEN_DTYPES[self.meta["token_dtype"]])
        if self.kind == "sft":
            name = f"{split}_idx.npy"
            offsets = np.asarray(load_checked_npy(self._path(name), self.meta["files"].get(name), "offsets"),
                                 dtype=np.int64)
            total = int(self.meta["files"][f"{split}_tokens.bin"]["bytes"]) // self.dtype.itemsize
            self.starts, self.ends = offsets, np.append(offsets[1:], total)
            self.shard_starts = [0]
        elif self.kind == "pretrain":
            self._pretrain_boundaries()
        else:
            raise ConfigError(f"{self.cache}: kind {self.kind!r}; documents are traced in pretraining and SFT caches")

    def _path(self, rel: str) -> Path:
        """A file of the cache on local disk (fetched first where the cache is at a URL)."""
        return Path(self.remote.fetch(rel)) if self.remote is not None else self.local / rel

    def _shards(self) -> list[tuple[str, dict]]:
        return split_shards(self.local, self.meta, self.split, remote=self.remote is not None)

    def _shard(self, name: str, rec: dict) -> np.ndarray:
        return shard_array(self._path(f"{self.split}/{name}"), self.meta, rec, self.dtype)

    def _pretrain_boundaries(self) -> None:
        sep = self.meta.get("document_separator") or {}
        sep_id = sep.get("id", (self.meta.get("special_token_ids") or {}).get("eot"))
        after = not str(sep.get("position", "after")).startswith("before")
        cuts, base, self.shard_starts = [], 0, []
        for name, rec in self._shards():
            tokens = self._shard(name, rec)
            self.shard_starts.append(base)
            at = np.flatnonzero(np.asarray(tokens) == sep_id).astype(np.int64) + base
            cuts.append(at + 1 if after else at)
            base += len(tokens)
        cut = np.concatenate(cuts) if cuts else np.zeros(0, np.int64)
        edges = np.unique(np.concatenate([[0], cut, [base]]))
        self.starts, self.ends = edges[:-1], edges[1:]

    def __len__(self) -> int:
        return len(self.starts)

    def overlapping(self, start: int, stop: int) -> np.ndarray:
        """Indices of the documents holding any of the split's tokens [start, stop)."""
        first = int(np.searchsorted(self.ends, start, side="right"))
        last = int(np.searchsorted(self.starts, stop, side="left"))
        return np.arange(first, max(first, last), dtype=np.int64)

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """The split's tokens [start, stop) (tests compare them with what a loader delivered)."""
        if self.kind == "sft":
            tokens = np.memmap(self._path(f"{self.split}_tokens.bin"), dtype=self.dtype, mode="r")
            return np.asarray(tokens[start:stop], dtype=np.int64)
        out = []
        for (name, rec), first in zip(self._shards(), self.shard_starts, strict=True):
            n = int(rec.get("tokens", rec["bytes"] // self.dtype.itemsize))
            a, b = max(start, first), min(stop, first + n)
            if a < b:
                out.append(np.asarray(self._shard(name, rec)[a - first:b - first], dtype=np.int64))
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    @functools.cached_property
    def origins(self) -> tuple[np.ndarray, list[dict]] | None:
        """The split's origins (int64 [documents, 4]) and the inputs table, or None for a cache without them."""
        return read_origins(self.local, self.meta, self.split, self.remote) if "origins" in self.meta else None

    def _layout(self, i: int, inputs: int) -> str | None:
        """The layout input `i` was read with (meta.json's source.layouts: one per input, or one for all)."""
        layouts = (self.meta.get("source") or {}).get("layouts") or []
        return layouts[i] if len(layouts) == inputs else layouts[0] if len(layouts) == 1 else None

    def span(self, index: int) -> tuple[int, int]:
        """The split's tokens [start, end) of document `index`; a ConfigError naming the range past it."""
        if not 0 <= index < len(self):
            raise ConfigError(f"document {self.split}:{index}: {self.cache} holds documents {self.split}:0.."
                              f"{self.split}:{len(self) - 1} in its {self.split} split; give one of those")
        return int(self.starts[index]), int(self.ends[index])

    def origin(self, index: int) -> dict:
        inputs = [str(f) for f in (self.meta.get("source") or {}).get("files") or []]
        out = {"cache": self.cache, "split": self.split, "document": int(index),
               "cache_tokens": list(self.span(index)), "inputs": inputs}
        found = self.origins
        if found is not None and index < len(found[0]):
            out.update(origin_fields(found[0][index], found[1]))
            layout = self._layout(int(found[0][index][0]), len(found[1]))
            if layout in OASST_LAYOUTS:  # an oasst example: its tree and message ids, read from its record
                out.update(conversation_ids(out["input"], out["record"], layout) or {})
        elif len(inputs) == 1:
            out["input"] = inputs[0]
        else:
            out["input"] = None
            out["note"] = ("meta.json records no inputs" if not inputs else
                           f"meta.json does not record which of its {len(inputs)} inputs this document came from")
        return out


@functools.lru_cache(maxsize=16)
def _documents(cache: str, split: str, stamp: tuple) -> CacheDocuments:
    return CacheDocuments(cache, split)


def cache_documents(cache: str, split: str) -> CacheDocuments:
    """The documents of `split` of `cache`, read once per process while its meta.json stays the same file."""
    stamp: tuple = ()
    if not is_url(str(cache)):  # a URL's mirror is checked against the remote when it is opened
        try:
            st = (Path(cache) / META_NAME).stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            pass
    return _documents(str(cache), split, stamp)


def document_origin(cache: str, split: str, doc_index: int) -> dict:
    """What the cache knows of document `doc_index` of `split`: {cache, split, document, cache_tokens [start,
    end) in the split, inputs, input (None where meta.json does not say), note}."""
    return cache_documents(str(cache), split).origin(int(doc_index))


def read_origins(local: Path, meta: dict, split: str, remote=None) -> tuple[np.ndarray, list[dict]]:
    """A split's origins (int64 [documents, 4]) and the inputs table, each file checked against meta.json's
    sha256 (builders/origins.py: one origins.npy, train's rows then val's, and origins.json)."""
    names = meta["origins"]
    rel, table = names["file"], names["inputs"]
    if remote is not None:
        remote.fetch(rel)
        remote.fetch(table)
    arr = load_checked_npy(local / rel, meta["files"].get(rel), "origins")
    data = (local / table).read_bytes()
    if hashlib.sha256(data).hexdigest() != (meta["files"].get(table) or {}).get("sha256"):
        raise CacheMismatchError(f"{local / table}: sha256 differs from meta.json (the origins table changed after "
                                 "the build); rebuild the cache")
    doc = read_table(data, str(local / table))
    if sum(doc["splits"].values()) != len(arr):
        raise CacheError(f"{local / rel}: {len(arr)} origins, {table} counts {sum(doc['splits'].values())}; "
                         "rebuild the cache")
    return split_rows(arr, doc, split), doc["inputs"]


def origin_fields(row, inputs: list[dict]) -> dict:
    """The fields one origin row adds: input, input_sha256, record, where, chars."""
    i, record, a, b = (int(x) for x in row)
    entry = inputs[i]
    out = {"input": entry["path"], "input_sha256": entry["sha256"], "record": record,
           "where": record_where(entry, record)}
    if a >= 0:
        out["chars"] = [a, b if b >= 0 else None]
    return out


def record_where(entry: dict, record: int) -> str:
    """"a.jsonl, line 17" (a JSON Lines byte offset, turned into its line where the file is at hand),
    "b.parquet, row 4", or the file itself."""
    path, counts = entry["path"], entry.get("record", "")
    if counts.startswith("byte offset"):
        line = line_of(path, record)
        return f"{path}, line {line}" if line is not None else f"{path}, byte {record}"
    if counts.startswith("0:"):
        return path
    if counts.startswith("shard"):
        return f"{path}, shard {record >> 40}, row {record & ((1 << 40) - 1)}"
    return f"{path}, {counts.split(' ')[0]} {record}"


def line_of(path: str, offset: int) -> int | None:
    """The 1-based line starting at byte `offset` of a local, uncompressed file; None otherwise."""
    if (found := local_input(path)) is None:
        return None
    try:
        with open(found, "rb") as f:
            return f.read(offset).count(b"\n") + 1
    except OSError:
        return None


def line_offset(path: str, line: int) -> int | None:
    """The byte offset of 1-based `line` of a local, uncompressed file; None where it cannot be read."""
    if (found := local_input(path)) is None or line < 1:
        return None
    try:
        with open(found, "rb") as f:
            pos = 0
            for seen, raw in enumerate(f, 1):
                if seen == line:
                    return pos
                pos += len(raw)
    except OSError:
        return None
    return None


def find_document(cache: str, input_name: str, record: int) -> tuple[str, int]:
    """(split, index) of the document whose origin is `input_name` (its path as origins.json names it, or the
    end of it) and `record` (a JSON Lines line, a row, a record); ConfigError naming what was searched."""
    first = cache_documents(str(cache), "train")
    if first.origins is None:
        raise ConfigError(f"--document {input_name}:{record}: {cache} records no origins (built before they existed); "
                          "rebuild it, or give SPLIT:INDEX")
    inputs = first.origins[1]
    matches = [i for i, e in enumerate(inputs) if e["path"] == input_name or e["path"].endswith("/" + input_name.lstrip("./"))]
    if len(matches) != 1:
        listed = first_few([e["path"] for e in inputs], 5, " ...")
        what = "no input" if not matches else f"{len(matches)} inputs"
        raise ConfigError(f"--document {input_name}:{record}: {what} of {cache} named {input_name!r} (its inputs: "
                          f"{listed}); give the input's path as origins.json names it")
    i = matches[0]
    entry = inputs[i]
    want = record
    if entry.get("record", "").startswith("byte offset"):
        want = line_offset(entry["path"], record)
        if want is None:
            raise ConfigError(f"--document {input_name}:{record}: {entry['path']} has no line {record} here (or "
                              "cannot be read here); give a line of that file, or SPLIT:INDEX")
    for split in SPLITS:
        rows = cache_documents(str(cache), split).origins[0]
        hit = np.flatnonzero((rows[:, 0] == i) & (rows[:, 1] == want))
        if len(hit):
            return split, int(hit[0])
    raise ConfigError(f"--document {input_name}:{record}: no document of {cache} came from that record (it was "
                      "skipped, empty, or past the token budgets); check meta.json's skipped counts")


def packed_origin(bins: str, dataset, seq: int | None) -> dict:
    """What pack-sft's examples.npy says of packed sequence `seq`: its example and that example's origin where
    the SFT cache records one; {} where the bins say nothing."""
    manifest = getattr(dataset, "manifest", None) or {}
    rec, source = manifest.get("examples"), manifest.get("source") or {}
    if seq is None or not isinstance(rec, dict) or rec.get("name") != EXAMPLES_NAME or is_url(str(bins)):
        return {}
    examples = _examples(str(Path(bins) / EXAMPLES_NAME), rec.get("sha256"))
    example = int(examples[seq])
    out = {"example": example, "note": f"example {source.get('split', 'train')}:{example} of {source.get('cache_dir')}"}
    try:
        found = document_origin(str(source["cache_dir"]), str(source.get("split", "train")), example)
    except (KeyError, OSError, NielsGPTError):
        return out  # the SFT cache is not at hand here: the example's number is what the bins know
    out.update({k: found[k] for k in ("input", "input_sha256", "record", "where", "chars", "message_tree_id",
                                      "message_ids") if k in found})
    if "where" in out:
        out.pop("note")
    return out


@functools.lru_cache(maxsize=8)
def _examples(path: str, sha256: str | None) -> np.ndarray:
    return np.asarray(load_checked_npy(path, {"sha256": sha256}, "packed examples"), dtype=np.int64)


def record_text(cache: str, split: str, index: int) -> str | None:
    """The text of document `index` read again from its record (its character range of the record's text, after
    the text rules), where the cache records origins and the input is a local file at hand; None otherwise."""
    import pyarrow.parquet as pq  # lazy: only `trace --text` on a Parquet input reads one

    origin = document_origin(cache, split, index)
    chars, name = origin.get("chars"), origin.get("input")
    path = local_input(name) if name is not None else None
    if not chars or path is None:
        return None
    field = (cache_documents(cache, split).meta.get("source") or {}).get("text_field") or "text"
    counts = origin["where"]
    try:
        if ", line " in counts and path.suffix in (".jsonl", ".json"):
            with open(path, "rb") as f:
                f.seek(origin["record"])
                text = json.loads(f.readline())[field]
        elif ", row " in counts and path.suffix == ".parquet":
            text = pq.read_table(path, columns=[field]).column(field)[origin["record"]].as_py()
        elif counts == name:
            text = path.read_bytes().decode("utf-8")
        else:
            return None
    except (OSError, ValueError, KeyError, IndexError):
        return None
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    return text[chars[0]:chars[1]]
