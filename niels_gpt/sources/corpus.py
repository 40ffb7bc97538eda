"""A user's own corpus: any mix of local files, directories, globs and Hugging Face dataset ids.

    src = corpus(["data/", "extra/*.jsonl.zst", "notes.md"], text_field="text")
    src.iter_texts()                      # documents, in the order of the sources as given
    chats = corpus(["sft.jsonl"]).iter_conversations()

- Files: `.txt`/`.md`/`.raw` are one document each (BOM dropped, CRLF -> LF); `.jsonl`/`.json`
  (`.gz`, `.zst` compressed too) one record per line; `.parquet`, `.csv` and `.arrow` (an Arrow IPC
  file or stream, as `datasets` saves them) one record per row. A directory stands for its files of
  those kinds (recursively, sorted by relative path, dot-files out); a glob for its matches, sorted.
- Anything else that does not exist locally and looks like `owner/name` is a Hugging Face dataset,
  streamed (`load_dataset(id, name=hf_config, split=split, streaming=True)`).
- Text: the record's `text_field`. Chat (`chat=True`): the record's `messages_field`, a list of
  `{"role", "content"}`, or with `chat_columns=("instruction", "response")` one user turn and one
  assistant turn from those columns.
- A bad record (not JSON, the field missing or not text, messages of the wrong shape) is an error naming
  the file and line (record number for columnar files); with `on_bad_record="skip"` it is skipped and
  counted by reason, and the counts reach meta.json. Empty documents and null text are always skipped
  and counted.
- Nothing is materialised: one file (one Parquet/Arrow batch) is read at a time.
"""

from __future__ import annotations

import glob as globlib
import io
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources.base import (
    ChatSource,
    TextSource,
    iter_rows,
    normalise_text,
    open_stream,
    portable,
    read_text_file,
)

TEXT_FIELD = "text"
MESSAGES_FIELD = "messages"
ON_BAD_RECORD = ("error", "skip")
WHOLE_FILE = (".txt", ".md", ".raw")
LINES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst")
COLUMNAR = (".parquet", ".csv", ".arrow")
SUFFIXES = WHOLE_FILE + LINES + COLUMNAR
ROLES = ("system", "user", "assistant")


class BadRecord(Exception):
    """One record that cannot be used: `reason` is its count's name in meta.json."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def kind_of(path: Path) -> str | None:
    name = path.name.lower()
    return next((s for s in sorted(SUFFIXES, key=len, reverse=True) if name.endswith(s)), None)


def is_hf_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not any(c in spec for c in "*?[") and kind_of(Path(spec)) is None


def expand(specs: Sequence[str | os.PathLike]) -> list[Path | str]:
    """Local files (directories and globs expanded, sorted) and dataset ids, in the order given."""
    out: list[Path | str] = []
    for spec in specs:
        text = os.fspath(spec)
        p = Path(text)
        if p.is_dir():
            found = sorted((f for f in p.rglob("*") if f.is_file() and kind_of(f)
                            and not any(s.startswith(".") for s in f.relative_to(p).parts)),
                           key=lambda f: f.relative_to(p).as_posix())
            if not found:
                raise SourceError(f"{p}: no files of a known kind in this directory (known: {', '.join(SUFFIXES)})")
            out.extend(found)
        elif p.is_file():
            if kind_of(p) is None:
                raise SourceError(f"{p}: unknown file kind; known: {', '.join(SUFFIXES)}")
            out.append(p)
        elif any(c in text for c in "*?["):
            found = sorted(Path(f) for f in globlib.glob(text, recursive=True) if Path(f).is_file() and kind_of(Path(f)))
            if not found:
                raise SourceError(f"{text}: this glob matches no file of a known kind ({', '.join(SUFFIXES)})")
            out.extend(found)
        elif is_hf_id(text):
            out.append(text)
        else:
            raise SourceError(f"{text}: no such file or directory, and not a Hugging Face dataset id (owner/name)")
    return out


def _open_lines(path: Path):
    name = path.name.lower()
    raw = open(path, "rb")
    if name.endswith(".gz"):
        import gzip

        return gzip.GzipFile(fileobj=raw)
    if name.endswith(".zst"):
        try:
            import zstandard
        except ImportError as exc:
            raw.close()
            raise SourceError(f"{path}: reading .zst needs the `zstandard` package: pip install "
                              "'niels_gpt[corpus]'") from exc
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    return raw


def _json_lines(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, record or BadRecord) per non-blank line."""
    import json

    with _open_lines(path) as f:
        try:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}, line {n}"
                try:
                    record = json.loads(line.decode("utf-8"))
                except UnicodeDecodeError as e:
                    yield where, BadRecord("invalid_utf8", f"{where}: not UTF-8 ({e.reason} at byte {e.start} of the "
                                           "line); re-encode the file as UTF-8")
                    continue
                except ValueError as e:
                    yield where, BadRecord("invalid_json", f"{where}: not valid JSON ({e}); fix or remove this line")
                    continue
                if not isinstance(record, dict):
                    yield where, BadRecord("not_an_object", f"{where}: a JSON {type(record).__name__}, not an "
                                           "object; each line must be one {...} record")
                    continue
                yield where, record
        except (OSError, EOFError) as e:  # a truncated or corrupt .gz/.zst
            raise SourceError(f"{path}: cannot decompress ({e}); the file is truncated or damaged") from e


def _rows(path: Path, columns: list[str]) -> Iterator[tuple[str, Any]]:
    kind = kind_of(path)
    if kind == ".csv":
        import csv

        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f)
            for row in reader:
                yield f"{path}, line {reader.line_num}", row
        return
    import pyarrow as pa

    try:
        if kind == ".parquet":
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(path)
            present = [c for c in columns if c in pf.schema_arrow.names]
            batches = pf.iter_batches(columns=present or None)
        else:
            try:
                reader = pa.ipc.open_file(path)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            except pa.ArrowInvalid:
                batches = iter(pa.ipc.open_stream(path))
        i = 0
        for batch in batches:
            for row in batch.to_pylist():
                yield f"{path}, row {i}", row
                i += 1
    except (pa.ArrowException, OSError) as e:
        raise SourceError(f"{path}: cannot read this {kind} file ({e}); check that it is complete") from e


def _hf_rows(dataset_id: str, config: str | None, split: str) -> Iterator[tuple[str, Any]]:
    what = f"{dataset_id} (config {config}, split {split})"
    ds = open_stream(dataset_id, what, streaming=True, name=config, split=split)
    for i, row in iter_rows(ds, what):
        yield f"{dataset_id}, record {i}", row


class Corpus(TextSource, ChatSource):
    """Documents (or conversations) from a mix of local files and dataset ids."""

    name = "corpus"
    own_split = False
    streaming = True
    split_rule = "none: the sources in the order given; the builder splits"

    def __init__(self, items: list[Path | str], *, text_field: str, messages_field: str,
                 chat_columns: tuple[str, str] | None, on_bad_record: str, hf_config: str | None, split: str):
        super().__init__()
        self.items = items
        self.text_field, self.messages_field, self.chat_columns = text_field, messages_field, chat_columns
        self.on_bad_record, self.hf_config, self.split = on_bad_record, hf_config, split
        self.dataset_id = next((i for i in items if isinstance(i, str)), None)
        self.dataset_config = hf_config if self.dataset_id else None

    def files(self) -> list[str]:
        return [str(i) for i in self.items if isinstance(i, Path)]

    def input_paths(self) -> list[Path]:
        return [i for i in self.items if isinstance(i, Path)]

    def input_bytes(self) -> int | None:
        """Total bytes of the input, for a progress bar's ETA: only when every item is a local uncompressed text
        file (the bar counts the UTF-8 bytes of the documents read)."""
        if any(isinstance(i, str) or kind_of(i) not in WHOLE_FILE + (".jsonl", ".json") for i in self.items):
            return None
        return sum(i.stat().st_size for i in self.items)

    def _records(self, columns: list[str]) -> Iterator[tuple[str, Any]]:
        for item in self.items:
            if isinstance(item, str):
                yield from _hf_rows(item, self.hf_config, self.split)
            elif kind_of(item) in WHOLE_FILE:
                yield str(item), {self.text_field: read_text_file(item)}
            elif kind_of(item) in LINES:
                yield from _json_lines(item)
            else:
                yield from _rows(item, columns)

    def _bad(self, exc: BadRecord) -> None:
        if self.on_bad_record == "error":
            raise SourceError(f"{exc} (or pass --on-bad-record skip to skip and count such records)")
        self.skipped[exc.reason] += 1

    def _iter_split(self, split: str | None) -> Iterator[str]:
        for where, record in self._records([self.text_field]):
            try:
                if isinstance(record, BadRecord):
                    raise record
                text = _text(record, self.text_field, where)
            except BadRecord as exc:
                self._bad(exc)
                continue
            if text is None:
                self.skipped["null_text"] += 1
            elif not text.strip():
                self.skipped["empty_document"] += 1
            else:
                yield normalise_text(text) if "\r" in text or text.startswith("\ufeff") else text

    def iter_conversations(self) -> Iterator[list[dict]]:
        columns = list(self.chat_columns) if self.chat_columns else [self.messages_field]
        for where, record in self._records(columns):
            try:
                if isinstance(record, BadRecord):
                    raise record
                yield (_column_pair(record, self.chat_columns, where) if self.chat_columns
                       else _messages(record, self.messages_field, where))
            except BadRecord as exc:
                self._bad(exc)

    def _describe_extra(self) -> dict[str, Any]:
        return {"items": [portable(i) if isinstance(i, Path) else i for i in self.items],
                "text_field": self.text_field, "messages_field": self.messages_field,
                "chat_columns": list(self.chat_columns) if self.chat_columns else None,
                "on_bad_record": self.on_bad_record, "split": self.split}


def _text(record: dict, field: str, where: str) -> str | None:
    if field not in record:
        raise BadRecord("missing_field", f"{where}: no {field!r} field (fields: {sorted(record)}); pass "
                        "--text-field NAME or fix the record")
    text = record[field]
    if text is not None and not isinstance(text, str):
        raise BadRecord("not_text", f"{where}: field {field!r} is {type(text).__name__}, not text; point "
                        "--text-field at a string field")
    return text


def _messages(record: dict, field: str, where: str) -> list[dict]:
    if field not in record:
        raise BadRecord("missing_field", f"{where}: no {field!r} field (fields: {sorted(record)}); pass "
                        "--messages-field NAME, or --chat-columns USER_COL,ASSISTANT_COL")
    msgs = record[field]
    if not isinstance(msgs, list):
        raise BadRecord("bad_messages", f"{where}: {field!r} is {type(msgs).__name__}, not a list of "
                        "{\"role\", \"content\"} messages")
    out = []
    for k, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise BadRecord("bad_messages", f"{where}: message {k} is not {{\"role\": one of {list(ROLES)}, "
                            f"\"content\": str}} (got {str(m)[:80]})")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _column_pair(record: dict, columns: tuple[str, str], where: str) -> list[dict]:
    out = []
    for col, role in zip(columns, ("user", "assistant"), strict=True):
        value = record.get(col)
        if not isinstance(value, str):
            raise BadRecord("missing_field" if col not in record else "not_text",
                            f"{where}: column {col!r} is {'missing' if col not in record else type(value).__name__}, "
                            "not text; pass --chat-columns USER_COL,ASSISTANT_COL")
        out.append({"role": role, "content": value})
    return out


def corpus(sources: Sequence[str | os.PathLike], *, text_field: str = TEXT_FIELD,
           messages_field: str = MESSAGES_FIELD, chat_columns: Sequence[str] | None = None,
           on_bad_record: str = "error", hf_config: str | None = None, split: str = "train") -> Corpus:
    """A corpus over `sources` (files, directories, globs, dataset ids); see the module docstring."""
    if on_bad_record not in ON_BAD_RECORD:
        raise ConfigError(f"on_bad_record must be one of {ON_BAD_RECORD}, got {on_bad_record!r}")
    if chat_columns is not None and len(chat_columns) != 2:
        raise ConfigError(f"chat_columns must name two columns (user, assistant), got {list(chat_columns)}")
    if not sources:
        raise ConfigError("no sources given: pass files, directories, globs or dataset ids")
    return Corpus(expand(sources), text_field=text_field, messages_field=messages_field,
                  chat_columns=tuple(chat_columns) if chat_columns else None, on_bad_record=on_bad_record,
                  hf_config=hf_config, split=split)
