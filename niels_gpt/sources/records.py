"""The one record-reader layer: every input kind, cut into pieces that tasks read, read into records.

| kind                               | a record                      | a piece (what one task reads)        |
|------------------------------------|-------------------------------|--------------------------------------|
| `.txt .md .raw`                    | the whole file (`FileText`)   | the file                             |
| `.jsonl .json`                     | one JSON object per line      | a byte range cut just after a newline |
| `.json` holding one document       | an element of its array       | the file (read whole, into memory)    |
| `.jsonl.gz .json.gz .jsonl.zst ...`| one JSON object per line      | the file (a stream cannot be cut)     |
| `.parquet`                         | one row                       | a run of whole row groups             |
| `.arrow` (IPC file; stream format) | one row                       | a run of record batches (the file)    |
| `.csv`                             | one row (header names fields) | the file                             |
| a file at a URL                    | as its kind                   | the file                             |
| a dataset id (owner/name)          | one row of the stream         | one shard (`IterableDataset.shard`)   |
| a dataset id, shuffled             | a row of the shuffled stream  | the whole stream (`.shuffle`)         |

- Bytes are strict UTF-8: a bad line is a `BadRecord` naming file, line and byte (the caller fails, or skips
  and counts by reason); in a whole text file a SourceError. A compressed file that ends early is an error.
- Where is a record: `"<file>, line N"`, `"<file>, row N"` (columnar), `"<id>, record N"` (a dataset).
- A shuffled dataset id is `load_dataset(id, streaming=True).shuffle(seed, buffer_size)` read as one piece:
  the shuffle mixes rows across shards, so no cut into shards gives the same stream. A dataset that fails to
  open, or to read past a record, is a SourceError naming the dataset, its options and the record.
Cost: one read of each input byte; a JSON Lines range is read in one call (task_bytes of memory).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from niels_gpt.errors import NielsGPTError, SourceError, StorageError
from niels_gpt.sources.inputs import (
    COLUMNAR,
    COMPRESSED_TEXT,
    LINES,
    UNLISTABLE,
    WHOLE_FILE,
    ReadAs,
    RemoteFile,
    ask,
    kind_of,
)
from niels_gpt.sources.lines import READ_BLOCK, decompressed, json_lines, opens_a_document
from niels_gpt.sources.text_io import (
    FileText,
    broken_link,
    cannot_read,
    decode_utf8,
    invalid_utf8_error,
    normalise_text,
    read_text_file,
)
from niels_gpt.storage.fs import bounded_call, described, filesystem, scheme_of
from niels_gpt.storage.remote import MIRRORS, local_cache_dir
from niels_gpt.storage.settings import network_timeout_s

ARROW_ROWS = 128  # rows a Parquet file is read in
CSV_FIELD_CHARS = 2**31 - 1  # a CSV field may hold a document of any length, as a JSON Lines field does


@dataclass(frozen=True, kw_only=True)
class Piece:
    """A run of one input's records (module table); `stop` -1: the whole input. JSON-able for a worker;
    `config`/`split`/`shuffle_*` only for a dataset id (unset shuffle fields stay out of the JSON)."""

    item: str
    kind: str
    start: int = 0
    stop: int = -1
    config: str | None = None
    split: str | None = None
    shuffle_seed: int | None = None
    shuffle_buffer: int | None = None

    def where(self) -> str:
        if self.shuffled:
            return f"{self.item} shuffled (seed {self.shuffle_seed}, buffer {self.shuffle_buffer})"
        if self.stop < 0:
            return self.item
        unit = {".jsonl": "bytes", ".json": "bytes", ".parquet": "row groups", ".arrow": "record batches"}.get(self.kind)
        if self.kind == "dataset":
            return f"{self.item} shard {self.start} of {self.stop}"
        return f"{self.item} {unit} {self.start}-{self.stop}"

    @property
    def shuffled(self) -> bool:
        return self.shuffle_buffer is not None

    @property
    def remote(self) -> bool:
        """A file at a URL."""
        return "://" in self.item

    def to_json(self) -> dict:
        out = asdict(self)
        for key in ("shuffle_seed", "shuffle_buffer"):
            if out[key] is None:
                del out[key]
        return out


def hub_shuffle(seed: int, buffer_size: int) -> dict:
    """meta.json's record of a shuffled dataset stream: who shuffled it, with what."""
    return {"by": "datasets", "seed": seed, "buffer_size": buffer_size,
            "call": f"load_dataset(..., streaming=True).shuffle(seed={seed}, buffer_size={buffer_size}), "
                    "read in order"}


def item_of(item: Path | RemoteFile | ReadAs | str) -> tuple[str, str, bool]:
    """(name, kind, remote) of an expanded input."""
    if isinstance(item, ReadAs):
        return item_of(item.path)[0], item.kind, False
    if isinstance(item, RemoteFile):
        return item.url, kind_of(item), True
    if isinstance(item, Path):
        try:
            return str(item.resolve(strict=True)), kind_of(item), False
        except FileNotFoundError:
            if item.is_symlink():
                raise broken_link(item, loop=False) from None
            raise SourceError(f"{item}: no such file (it went away after the inputs were listed); rerun when the "
                              "input is in place") from None
        except (RuntimeError, OSError):  # a symlink loop: RuntimeError before Python 3.13, OSError(ELOOP) after
            raise broken_link(item, loop=True) from None
    return item, "dataset", False


def pieces(item: Path | RemoteFile | str, task_bytes: int, *, config: str | None = None,
           split: str = "train") -> list[Piece]:
    """The pieces of one expanded input (module table); planning reads only sizes, a few bytes at each
    cut, Parquet footers and Arrow file footers."""
    name, kind, remote = item_of(item)
    if kind == "dataset":
        n = open_stream(name, f"dataset {name}", streaming=True, name=config, split=split).num_shards
        return [Piece(item=name, kind=kind, start=i, stop=n, config=config, split=split) for i in range(n)]
    if remote:
        return [Piece(item=name, kind=kind)]
    path = Path(name)
    if kind == ".json" and _opens_a_document(path):
        return [Piece(item=name, kind=kind)]  # one JSON document: read whole
    cut = {".jsonl": _line_ranges, ".json": _line_ranges, ".parquet": _parquet_runs, ".arrow": _arrow_runs}.get(kind)
    runs = cut(path, task_bytes) if cut else None  # None: read whole (an Arrow stream too)
    return [Piece(item=name, kind=kind, start=a, stop=b) for a, b in runs] if runs else [Piece(item=name, kind=kind)]


def _opens_a_document(path: Path) -> bool:
    """Whether a local `.json` file's first non-blank line opens one JSON document (lines.opens_a_document)."""
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.strip():
                    return opens_a_document(line[:READ_BLOCK])
    except OSError as e:
        raise cannot_read(path, e) from e
    return False


def _line_ranges(path: Path, task_bytes: int) -> list[tuple[int, int]]:
    """ceil(size / task_bytes) ranges of about equal size, each cut just after the first newline at or past
    i/n of the file: equal ranges leave no small last task, so workers taking them two by two end together."""
    size = path.stat().st_size
    n = max(1, -(-size // task_bytes))
    cuts = [0]
    with open(path, "rb") as f:
        for i in range(1, n):
            f.seek(max(i * size // n, cuts[-1] + 1) - 1)
            pos = f.tell()
            while True:
                chunk = f.read(1 << 16)
                if not chunk:
                    pos = size
                    break
                nl = chunk.find(b"\n")
                if nl >= 0:
                    pos += nl + 1
                    break
                pos += len(chunk)
            if pos >= size:
                break
            cuts.append(pos)
    cuts.append(size)
    return [(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a] or [(0, 0)]


def _parquet_runs(path: Path, task_bytes: int) -> list[tuple[int, int]]:
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except Exception as e:  # noqa: BLE001 (pyarrow raises several kinds for a file that is not Parquet)
        raise SourceError(f"{path}: not a readable Parquet file ({type(e).__name__}: {e}); check the file") from e
    return _runs([meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)], task_bytes)


def _arrow_runs(path: Path, task_bytes: int) -> list[tuple[int, int]] | None:
    """Runs of record batches of an Arrow IPC file; None for the stream format (read whole)."""
    import pyarrow as pa

    try:
        reader = pa.ipc.open_file(pa.memory_map(str(path)))  # mapped: the sizes need no batch's data read
    except (pa.ArrowInvalid, OSError):
        return None
    return _runs([reader.get_batch(b).nbytes for b in range(reader.num_record_batches)], task_bytes)


def _runs(sizes: list[int], task_bytes: int) -> list[tuple[int, int]]:
    """[start, stop) runs of consecutive blocks, each closed once it holds task_bytes (or at the end)."""
    runs, start, acc = [], 0, 0
    for k, size in enumerate(sizes):
        acc += size
        if acc >= task_bytes or k == len(sizes) - 1:
            runs.append((start, k + 1))
            start, acc = k + 1, 0
    return runs or [(0, 0)]


def records(piece: Piece, columns: list[str] | None = None) -> Iterator[tuple[str, Any]]:
    """(where, FileText | dict | BadRecord) for every record of `piece`, in order."""
    kind = piece.kind
    if kind == "dataset":
        what = f"{piece.item} (config {piece.config}, split {piece.split})"
        ds = open_stream(piece.item, what, streaming=True, name=piece.config, split=piece.split)
        if piece.shuffled:
            ds = ds.shuffle(seed=piece.shuffle_seed, buffer_size=piece.shuffle_buffer)
        elif piece.stop >= 0:
            ds = ds.shard(num_shards=piece.stop, index=piece.start)
        name = piece.item if piece.stop <= 1 else piece.where()  # "owner/name shard 3 of 8" when sharded
        for i, row in iter_rows(ds, what):
            yield f"{name}, record {i}", row
    elif kind in WHOLE_FILE:
        yield piece.item, FileText(_read_text(piece))
    elif kind in LINES:
        yield from json_lines(piece, _open_binary)
    elif kind == ".csv":
        yield from _csv_rows(piece)
    elif kind in COLUMNAR:
        with _local_copy(piece) as local:
            yield from _arrow_rows(piece, local, columns)
    else:
        raise SourceError(f"{piece.item}: unknown file kind {kind!r}; the plan was made by another version")


def open_stream(path_or_id: str, what: str, *, streaming: bool = True, **kwargs: Any):
    """datasets.load_dataset(...) with failures turned into SourceError naming what was opened."""
    from datasets import load_dataset

    try:
        return load_dataset(path_or_id, streaming=streaming, **kwargs)
    except Exception as e:  # the hub, fsspec and pyarrow raise many kinds; the message is what helps
        raise SourceError(f"{what}: cannot open {path_or_id!r} ({_kwargs_text(kwargs)}): "
                          f"{type(e).__name__}: {e}; check the dataset id/config and network, or download its "
                          "files and pass them instead") from e


def iter_rows(ds, what: str) -> Iterator[tuple[int, dict]]:
    """(record index, row) from a datasets stream, read errors turned into SourceError naming the record."""
    i = 0
    try:
        for row in ds:
            yield i, row
            i += 1
    except UnicodeDecodeError as e:
        raise SourceError(f"{what}: invalid UTF-8 near record {i}: {e}; re-encode the input as UTF-8") from e
    except SourceError:
        raise
    except Exception as e:
        raise SourceError(f"{what}: could not read past record {i}: {type(e).__name__}: {e}; "
                          "check that the dataset is valid and of the expected schema") from e


def _kwargs_text(kwargs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if v is not None) or "no options"


def _open_binary(piece: Piece):
    if not piece.remote:
        try:
            return open(piece.item, "rb")
        except OSError as e:
            raise cannot_read(piece.item, e) from e
    fs, path = filesystem(piece.item)
    streamed = {"block_size": 0} if scheme_of(piece.item) in UNLISTABLE else {}  # http: one GET, no ranges
    raw = ask(lambda: fs.open(path, "rb", **streamed), piece.item, "opening")
    return io.BufferedReader(_Guarded(raw, piece.item), buffer_size=READ_BLOCK)  # fsspec's readline seeks


class _Guarded(io.RawIOBase):
    """A stream of a file at a URL whose failed read (a stall too: storage.fs._options) is one StorageError."""

    def __init__(self, raw, url: str):
        self.raw, self.url = raw, url

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        try:
            data = self.raw.read(len(buf))
        except NielsGPTError:
            raise
        except Exception as exc:  # noqa: BLE001 - a stall, a reset, a body cut short: the user's one line
            raise StorageError(f"reading {self.url}: {described(exc)}; check the server and the network, or raise "
                               f"the limit with --network-timeout SECONDS (now {network_timeout_s():g} s)") from exc
        buf[:len(data)] = data
        return len(data)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.raw.close()
        super().close()


@contextlib.contextmanager
def _local_copy(piece: Piece) -> Iterator[Path]:
    """A local path of the file: itself, or a download into the local download cache, deleted afterwards."""
    if not piece.remote:
        yield Path(piece.item)
        return
    fs, path = filesystem(piece.item)
    tmp = (local_cache_dir() / MIRRORS / "sources"
           / f"{hashlib.sha256(piece.item.encode()).hexdigest()[:16]}-{RemoteFile(piece.item).name}.tmp-{os.getpid()}")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        ask(lambda: bounded_call(fs, "get_file", path, os.fspath(tmp)), piece.item, "downloading", bounded=True)
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _read_text(piece: Piece) -> str:
    if piece.kind in COMPRESSED_TEXT:
        return normalise_text(decode_utf8(decompressed(piece, _open_binary), piece.item))
    if not piece.remote:
        return read_text_file(Path(piece.item))
    with _open_binary(piece) as f:
        return normalise_text(decode_utf8(f.read(), piece.item))


def _csv_rows(piece: Piece) -> Iterator[tuple[str, Any]]:
    import csv

    csv.field_size_limit(CSV_FIELD_CHARS)  # (the default, 131,072 characters, refused a long document)
    with io.TextIOWrapper(_open_binary(piece), encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        try:
            for row in reader:
                yield f"{piece.item}, line {reader.line_num}", row
        except UnicodeDecodeError as e:
            raise invalid_utf8_error(piece.item, e.start, record=f"near line {reader.line_num}", reason=e.reason) from e


def _arrow_rows(piece: Piece, local: Path, columns: list[str] | None) -> Iterator[tuple[str, Any]]:
    import pyarrow as pa

    try:
        if piece.kind == ".parquet":
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(local)
            present = [c for c in (columns or []) if c in pf.schema_arrow.names] or None
            groups = range(pf.num_row_groups) if piece.stop < 0 else range(piece.start, piece.stop)
            first = sum(pf.metadata.row_group(g).num_rows for g in range(groups.start))
            # runs of rows, not whole row groups: a plan's look at the first record decodes its first rows only
            # (on this thread: the build's own threads have the cores)
            batches = pf.iter_batches(ARROW_ROWS, list(groups), present, use_threads=False) if groups else iter(())
        else:
            first = 0
            try:
                reader = pa.ipc.open_file(local)
                span = range(reader.num_record_batches) if piece.stop < 0 else range(piece.start, piece.stop)
                # the rows before this run, counted on a map of the file: each batch's header is read, not the
                # batch (read through `reader`, task k of a file would read all k batches before its own)
                counted = pa.ipc.open_file(pa.memory_map(str(local))) if span.start else None
                first = sum(counted.get_batch(b).num_rows for b in range(span.start)) if counted else 0
                batches = (reader.get_batch(b) for b in span)
            except pa.ArrowInvalid:
                batches = iter(pa.ipc.open_stream(local))
        i = first
        for batch in batches:
            for row in batch.to_pylist():
                yield f"{piece.item}, row {i}", row
                i += 1
    except UnicodeDecodeError as e:
        raise invalid_utf8_error(piece.item, e.start, record=f"near row {i}", reason=e.reason) from e
    except (pa.ArrowException, OSError) as e:
        raise SourceError(f"{piece.item}: cannot read this {piece.kind} file ({e}); check that it is complete") from e
